"""The malicious aggregator's machine (cco.interop.hostile) tampers with exactly the
calls it says it tampers with, and what it sends fails an endpoint's verification.

The live trials (tests/e2e/hostile/test_malicious_aggregator.py) run it as a process;
here it wraps a stand-in machine that answers two contributions with their honest
combination, so each attack's output can be checked directly.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from cco.interop.hostile import ATTACKS, SCALE_ATTACKS, TamperingMachine
from cco.nodes.events import Input, MessageReceived, SendMessage
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import ChunkMessage, Result
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes(range(16))
OTHER = bytes(range(1, 17))
KEYS = derive_group_keys(b"\x11" * 32, GROUP)
EVERYONE = frozenset({0, 1})


class Combiner:
    """Answers the second contribution of a chunk with the honest Result, to two children."""

    def __init__(self) -> None:
        self.parts: dict[tuple[bytes, int, int], list[ChunkMessage]] = {}

    def handle(self, event: Input, now: float) -> list[SendMessage]:
        assert isinstance(event, MessageReceived) and isinstance(event.message, ChunkMessage)
        message = event.message
        parts = self.parts.setdefault((message.group_id, message.op_id, message.chunk_index), [])
        parts.append(message)
        if len(parts) < 2:
            return []
        result = combine(parts, Result)
        return [SendMessage("child-0", result), SendMessage("child-1", result)]

    def next_deadline(self) -> None:
        return None


def contributions(group: bytes, op_id: int, chunk_index: int = 0) -> list[ChunkMessage]:
    header = ChunkHeader(
        group_id=group,
        epoch=1,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=16,
        chunk_elements=8,
        chunk_index=chunk_index,
    )
    keys = derive_group_keys(b"\x11" * 32, group)
    return [seal(keys, header, rank, np.arange(8, dtype=np.int64) * (rank + 2) - 5) for rank in (0, 1)]


def run_call(machine: TamperingMachine, group: bytes, op_id: int) -> list[SendMessage]:
    out: list[SendMessage] = []
    for chunk_index in (0, 1):
        for rank, part in enumerate(contributions(group, op_id, chunk_index)):
            out += machine.handle(MessageReceived(f"child-{rank}", part), 0.0)  # type: ignore[arg-type]
    return out


def verified(message: ChunkMessage) -> bool:
    try:
        open_verified(KEYS, message, EVERYONE)
    except CcoError as error:
        assert error.code in (ErrorCode.VERIFICATION_FAILED, ErrorCode.INVALID_FIELD)
        return False
    return True


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a not in SCALE_ATTACKS])
def test_the_odd_calls_are_tampered_and_fail_verification(attack: str) -> None:
    log = io.StringIO()
    machine = TamperingMachine(Combiner(), attack, frozenset({GROUP}), seed=3, log=log)
    run_call(machine, OTHER, 0)  # the source of other-group, never attacked
    sent = {op_id: run_call(machine, GROUP, op_id) for op_id in range(4)}
    named = {json.loads(line)["ordinal"] for line in log.getvalue().splitlines()}
    assert named == {1, 3}  # never-started acts on calls 0 and 2 and names the calls it poisons
    for op_id, commands in sent.items():
        results = [c.message for c in commands if c.message.op_id == op_id]
        assert len(results) == 4, (attack, op_id)  # two chunks to two children
        if attack == "never-started":
            ahead = [c.message for c in commands if c.message.op_id != op_id]
            assert bool(ahead) == (op_id % 2 == 0)
            assert not any(verified(m) for m in ahead)
            assert all(verified(m) for m in results)
        elif op_id in named:
            assert not all(verified(m) for m in results), (attack, op_id)
        else:
            assert all(verified(m) for m in results), (attack, op_id)


def test_a_target_shorter_than_a_group_id_attacks_every_group_it_begins() -> None:
    """The live trials form a group per trial: one prefix names them all."""
    log = io.StringIO()
    machine = TamperingMachine(Combiner(), "change-element", frozenset({GROUP[:1]}), seed=3, log=log)
    other_keys = derive_group_keys(b"\x11" * 32, OTHER)
    for command in run_call(machine, OTHER, 1):  # another first byte: honest
        open_verified(other_keys, command.message, EVERYONE)
    tampered = run_call(machine, GROUP, 1)
    assert tampered and not any(verified(c.message) for c in tampered)
    assert {json.loads(line)["group"] for line in log.getvalue().splitlines()} == {GROUP.hex()}
