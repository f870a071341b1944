"""A malicious aggregator: ``cco-node``'s aggregator with one of issue 41's tamperings.

It runs the honest aggregator machine and rewrites what goes in and out of it, the
way a compromised aggregator holding no key could: every attack below edits values,
tags, bitmaps or headers of the Results it sends down (and, for split scales, what
it accepts from its children).  It attacks the groups named (``--target-group``: a
group id, or the first bytes of the ids of every group it attacks), and in them the
odd calls only, so the honest calls in between show that nothing is
refused wrongly.  A call is one data operation, with its scale pass before it when
it is block-scaled; the runner keeps every call of a group in one form, so that
call ``n`` is operation ``n`` (``2n`` and ``2n + 1`` when block-scaled) whether or
not the aggregator saw it (a call that fails at its start sends nothing).  Each
tampering is written as a JSON line to
``--tamper-log``: the runner (benchmarks/support/tamper_trials.py) checks that every
call named there failed on every rank and that no rank got data other than the
exact result.

    python -m cco.interop.hostile --attack change-element --target-group HEX --seed 1 \\
        --tamper-log tamper.jsonl -- <cco-node aggregator arguments>

The attacks (:data:`ATTACKS`):

* change-element: one element of the result moved by a random amount;
* drop-with-bit / drop-keep-bit: one rank's contribution left out, with its bit
  cleared, or kept;
* count-twice: one rank's contribution added again (values and tag);
* replay-old: an earlier call's result of the same shape under this call's header;
* other-group: another group's result of the same shape under this group's header;
* swap-chunks: the payloads and tags of chunks 0 and 1 exchanged;
* invent-contributor: a rank that is not a member added, with made-up values and tag;
* never-started: a Result for the next call, which has not started, sent ahead;
* inflate-scale: one block's agreed scale (the scale pass's result) raised;
* split-scale: one child told a lower scale for one block than the others, and the
  children's chunks combined as if they agreed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import signal
import sys
from typing import Any, TextIO

import numpy as np

from cco.nodes.events import Command, Input, MessageReceived, SendMessage
from cco.wire import payload
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import ChunkMessage, Contribution, Result
from cco.wire.modp import P
from cco.wire.packing import fits_width, minimal_width, narrow, unpack
from cco.wire.registries import DType, ReduceOp

ATTACKS = (
    "change-element",
    "drop-with-bit",
    "drop-keep-bit",
    "count-twice",
    "replay-old",
    "other-group",
    "swap-chunks",
    "invent-contributor",
    "never-started",
    "inflate-scale",
    "split-scale",
)
SCALE_ATTACKS = ("inflate-scale", "split-scale")

ChunkKey = tuple[bytes, int, int, int]  # group, epoch, op_id, chunk_index


def _key(message: ChunkMessage) -> ChunkKey:
    return (message.group_id, message.epoch, message.op_id, message.chunk_index)


def _shape(message: ChunkMessage) -> tuple[Any, ...]:
    """What a result must share with this one to stand in for it."""
    return (
        message.dtype,
        message.op,
        message.element_count,
        message.block_count,
        message.width if message.block_elements is not None else None,
    )


def _scaled_call(message: ChunkMessage) -> bool:
    """Whether the chunk is of a block-scaled call: its data (block_elements set) or its
    scale pass (the MIN of int16 proposals, untagged)."""
    if message.block_elements is not None:
        return True
    return message.tag is None and message.op is ReduceOp.MIN and message.dtype is DType.INT16


def _with_values(message: ChunkMessage, values: np.ndarray, **changes: Any) -> ChunkMessage:
    """``message`` carrying other integers: at its fixed width if block-scaled (clipped
    to that width's range if they do not fit), else at their smallest width."""
    values = values.astype(np.int64)
    width = message.width
    if message.block_elements is None:
        width = minimal_width(int(values.min(initial=0)), int(values.max(initial=0)))
    elif not fits_width(int(values.min(initial=0)), int(values.max(initial=0)), width):
        values = np.clip(values, -(1 << (8 * width - 1)), (1 << (8 * width - 1)) - 1)
    packed = narrow(values, width).tobytes()
    return dataclasses.replace(message, width=width, payload=packed, **changes)


def _values(message: ChunkMessage) -> np.ndarray:
    return unpack(message.payload, message.width).astype(np.int64)


class TamperingMachine:
    """The honest aggregator machine ``inner`` with ``attack`` applied to the groups
    whose ids start with one of ``targets``.  It keeps what it saw of every chunk (a
    tool for bounded trial runs, not a node to leave running)."""

    def __init__(
        self, inner: Any, attack: str, targets: frozenset[bytes], seed: int, log: TextIO | None
    ) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}: one of {', '.join(ATTACKS)}")
        self.inner = inner
        self.attack = attack
        self.targets = targets
        self.rng = random.Random(seed)
        self.log = log
        self._parts: dict[ChunkKey, dict[bytes, ChunkMessage]] = {}  # by contributors bitmap
        self._first_scales: dict[ChunkKey, bytes | None] = {}  # split-scale: what the first child said
        self._split: dict[ChunkKey, tuple[str, ChunkMessage]] = {}  # split-scale: (told the truth, the lie)
        self._done: dict[ChunkKey, list[ChunkMessage] | None] = {}  # tampered Result per chunk
        self._held: dict[tuple[bytes, int, int], list[tuple[SendMessage, ChunkMessage]]] = {}  # swap-chunks
        self._swapped: dict[tuple[bytes, int, int], dict[int, ChunkMessage]] = {}  # swap-chunks: sent
        self._recent: dict[tuple[Any, ...], ChunkMessage] = {}  # replay-old: this group's results
        self._others: dict[tuple[Any, ...], ChunkMessage] = {}  # other-group: other groups' results

    # --- the machine interface ------------------------------------------------------

    def handle(self, event: Input, now: float) -> list[Command]:
        event = self._incoming(event)
        out: list[Command] = []
        for command in self.inner.handle(event, now):
            out += self._outgoing(command)
        return out

    def next_deadline(self) -> float | None:
        deadline: float | None = self.inner.next_deadline()
        return deadline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # --- calls ------------------------------------------------------------------------

    def _targeted(self, group_id: bytes) -> bool:
        """Whether ``group_id`` is attacked: it starts with one of the targets (a whole
        group id is its own prefix)."""
        return any(group_id.startswith(target) for target in self.targets)

    @staticmethod
    def _ordinal(message: ChunkMessage) -> int:
        """The call ``message`` belongs to (see the module's docstring)."""
        return message.op_id // 2 if _scaled_call(message) else message.op_id

    def _attacked(self, message: ChunkMessage) -> bool:
        if not self._targeted(message.group_id):
            return False
        scale_pass = message.tag is None
        if scale_pass != (self.attack in SCALE_ATTACKS):
            return False
        # never-started acts on the first call of a pair and targets the second, the
        # other attacks target the second call itself
        return self._ordinal(message) % 2 == (0 if self.attack == "never-started" else 1)

    def _note(self, message: ChunkMessage, detail: str, ordinal: int | None = None) -> None:
        if self.log is None:
            return
        line = {
            "attack": self.attack,
            "group": message.group_id.hex(),
            "op_id": message.op_id,
            "chunk": message.chunk_index,
            "ordinal": self._ordinal(message) if ordinal is None else ordinal,
            "detail": detail,
        }
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()

    # --- in ---------------------------------------------------------------------------

    def _incoming(self, event: Input) -> Input:
        if not isinstance(event, MessageReceived) or not isinstance(event.message, Contribution):
            return event
        message = event.message
        if not self._targeted(message.group_id):
            return event
        if message.tag is not None:
            self._parts.setdefault(_key(message), {})[message.contributors] = message
            agreed = self._first_scales.setdefault(_key(message), message.scales)
            if self.attack == "split-scale" and message.scales != agreed:
                # a child told another scale: take its chunk as if they agreed
                return MessageReceived(event.peer, dataclasses.replace(message, scales=agreed))
        return event

    # --- out --------------------------------------------------------------------------

    def _outgoing(self, command: Command) -> list[Command]:
        if not isinstance(command, SendMessage) or not isinstance(command.message, Result):
            return [command]
        message = command.message
        if not self._targeted(message.group_id):
            if message.tag is not None:
                self._others[_shape(message)] = message
            return [command]
        if not self._attacked(message):
            if message.tag is not None:
                self._recent[_shape(message)] = message
            return [command]
        return self._tampered(command, message)

    def _tampered(self, command: SendMessage, message: ChunkMessage) -> list[Command]:
        if self.attack == "swap-chunks":
            return self._swap(command, message)
        if self.attack == "split-scale":
            return [self._split_scales(command, message)]
        key = _key(message)
        if key not in self._done:
            forged = self._forge(message)
            self._done[key] = forged
        forged_messages = self._done[key]
        if forged_messages is None:
            return [command]
        return [dataclasses.replace(command, message=m) for m in forged_messages]

    def _forge(self, message: ChunkMessage) -> list[ChunkMessage] | None:
        """The Results to send instead of ``message`` (None: send it as it is)."""
        attack, rng = self.attack, self.rng
        values = _values(message)
        elements = message.element_count
        if attack == "change-element" and elements:
            at = rng.randrange(elements)
            delta = rng.choice([-1, 1]) * rng.randint(1, 1000)
            changed = values.copy()
            changed[at] += delta
            self._note(message, f"element {at} {delta:+d}")
            return [_with_values(message, changed)]
        if attack in ("drop-with-bit", "drop-keep-bit", "count-twice"):
            parts = list(self._parts.get(_key(message), {}).values())
            if len(parts) < 2:
                return None
            victim = parts[rng.randrange(len(parts))]
            ranks = sorted(ranks_from_bitmap(victim.contributors))
            if attack == "count-twice":
                tag = ((message.tag or 0) + (victim.tag or 0)) % P
                twice = _with_values(message, values + _values(victim), tag=tag)
                self._note(message, f"ranks {ranks} counted twice")
                return [twice]
            rest = payload.combine([p for p in parts if p is not victim], Result)
            if attack == "drop-keep-bit":
                rest = dataclasses.replace(rest, contributors=message.contributors)
            self._note(message, f"ranks {ranks} dropped ({attack})")
            return [rest]
        if attack in ("replay-old", "other-group"):
            source = (self._recent if attack == "replay-old" else self._others).get(_shape(message))
            if source is None:
                return None
            self._note(message, f"{attack}: op {source.op_id} of group {source.group_id.hex()[:8]}")
            return [
                dataclasses.replace(
                    message,
                    width=source.width,
                    payload=source.payload,
                    tag=source.tag,
                    contributors=source.contributors,
                )
            ]
        if attack == "invent-contributor":
            world = max(ranks_from_bitmap(message.contributors)) + 1
            invented = rng.randint(world, world + 40)
            made_up = values.copy()
            made_up[:elements] += np.array(
                [rng.randint(-1000, 1000) for _ in range(elements)], dtype=np.int64
            )
            bits = bitmap_from_ranks(ranks_from_bitmap(message.contributors) | {invented})
            self._note(message, f"rank {invented} invented")
            forged_tag = ((message.tag or 0) + rng.randrange(P)) % P
            return [_with_values(message, made_up, contributors=bits, tag=forged_tag)]
        if attack == "never-started":
            step = 2 if message.block_elements is not None else 1  # a scaled call has a scale pass
            ahead = dataclasses.replace(message, op_id=message.op_id + step)
            self._note(
                message, f"a Result for op {ahead.op_id}, not started", ordinal=self._ordinal(message) + 1
            )
            return [message, ahead]
        if attack == "inflate-scale" and elements:
            at = rng.randrange(elements)
            raised = values.copy()
            raised[at] += rng.randint(1, 3)
            self._note(message, f"block {at} scale {int(values[at])} -> {int(raised[at])}")
            return [_with_values(message, raised)]
        return None

    def _swap(self, command: SendMessage, message: ChunkMessage) -> list[Command]:
        """Hold chunk 0's and chunk 1's Results until both are there, then send each
        with the other's payload and tag (and every later copy of them the same)."""
        if message.chunk_index > 1 or message.total_elements < 2 * message.chunk_elements:
            return [command]
        op = (message.group_id, message.epoch, message.op_id)
        swapped = self._swapped.get(op)
        if swapped is None:
            held = self._held.setdefault(op, [])
            held.append((command, message))
            first = {m.chunk_index: m for _, m in held}
            if len(first) < 2:
                return []
            swapped = self._swapped[op] = {
                0: dataclasses.replace(
                    first[0], payload=first[1].payload, tag=first[1].tag, width=first[1].width
                ),
                1: dataclasses.replace(
                    first[1], payload=first[0].payload, tag=first[0].tag, width=first[0].width
                ),
            }
            self._note(first[0], "chunks 0 and 1 swapped")
            return [dataclasses.replace(c, message=swapped[m.chunk_index]) for c, m in self._held.pop(op)]
        return [dataclasses.replace(command, message=swapped[message.chunk_index])]

    def _split_scales(self, command: SendMessage, message: ChunkMessage) -> SendMessage:
        """The first child told the agreed scales, every other one a lower scale for
        one block (which passes its MIN consistency check)."""
        key = _key(message)
        if key not in self._split:
            values = _values(message)
            lowered = values.copy()
            at = self.rng.randrange(len(values)) if len(values) else 0
            if len(lowered):
                lowered[at] -= self.rng.randint(1, 3)
            self._split[key] = (command.peer, _with_values(message, lowered))
            self._note(message, f"block {at} scale lowered for every child but {command.peer}")
        truthful, lie = self._split[key]
        if command.peer == truthful:
            return command
        return dataclasses.replace(command, message=lie)


def run(argv: list[str]) -> int:
    """The aggregator of ``cco-node`` with :class:`TamperingMachine` around its machine."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attack", required=True, choices=ATTACKS)
    parser.add_argument(
        "--target-group",
        required=True,
        help="the attacked groups, comma-separated: a group id (32 hex digits), or fewer digits "
        "for every group whose id starts with them",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tamper-log", help="a JSON line per tampering here")
    parser.add_argument("node", nargs=argparse.REMAINDER, help="cco-node arguments (after --)")
    args = parser.parse_args(argv)

    from cco.cli import node_parser
    from cco.config import parse_hostport, resolve
    from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
    from cco.services import roles
    from cco.services.node import NodeService
    from cco.wire.messages import Address
    from cco.wire.registries import Role

    node_args = args.node[1:] if args.node[:1] == ["--"] else args.node
    cfg = resolve(node_parser().parse_args(["--role", "aggregator", *node_args]))
    log = open(args.tamper_log, "a", encoding="utf-8") if args.tamper_log else None  # noqa: SIM115

    async def serve() -> int:
        host, port = parse_hostport(cfg.listen)
        adv_host, adv_port = parse_hostport(cfg.advertise or cfg.listen)
        config = AggregatorConfig(
            address=Address(host=adv_host, port=adv_port),
            capacity=cfg.capacity,
            max_fan_in=cfg.max_fan_in,
            labels=cfg.labels,
        )
        inner = AggregatorMachine(config)
        targets = frozenset(bytes.fromhex(group) for group in args.target_group.split(","))
        machine = TamperingMachine(inner, args.attack, targets, args.seed, log)
        service = NodeService(machine, cfg.require("node_id"), Role.AGGREGATOR, roles.transport_config(cfg))
        await service.listen(host, port)
        await service.join_rendezvous(*parse_hostport(cfg.rendezvous), cfg.rendezvous_id)
        print(f"tampering aggregator registered ({args.attack})", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await service.close()
        return 0

    try:
        return asyncio.run(serve())
    finally:
        if log is not None:
            log.close()


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
