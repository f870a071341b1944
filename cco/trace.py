"""``cco-node trace-analyze``: which rank a hung collective waits for, from every node's dump.

Each node's flight recorder (:mod:`cco.services.recorder`) says what it was doing
when it was dumped (SIGUSR1, :mod:`cco.services.dump`, or ``cco-node status --json``).
No single node knows why a collective hangs: an endpoint waits for its parent, the
root waits for a whole subtree.  Read together, they do: a chunk that a rank never
sent is missing at every aggregator on the rank's way to the root, and the deepest
of them (the one with the fewest ranks below it) waits for that rank itself, while
the aggregators above it miss the whole subtree only because that one waits.  So a
rank owes a chunk when the deepest aggregator above it that has an account of the
chunk still misses it; of those chunks, the earliest (by epoch, operation, chunk
index) is the one the rank owes first.  It then says what the rank's own dump says about that
chunk, or that there is none (a rank that is stopped, hung or gone cannot dump).

torch's ``fr_trace`` matches collectives across ranks' dumps to find the one that
did not enter; here the aggregators already know which ranks they wait for, so the
answer names the rank, the operation and the chunk.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cco.wire.errors import CcoError, ErrorCode

WAITING = "collecting"
"""The state of a chunk record that still waits for parts (cco.services.recorder)."""


@dataclass(frozen=True, slots=True)
class Owed:
    """A rank that owes a chunk, and where that was seen."""

    rank: int
    node_id: str | None  # the rank's process, when a dump names it
    group_id: str
    epoch: int
    op_id: int
    chunk_index: int
    kind: str
    waiting_node: str  # the deepest aggregator that waits for it
    waiting_since_ms: int  # in that node's clock (ms since it started)
    more_chunks: int  # further chunks the rank owes at that node
    dumped: bool  # whether the rank's own dump was among those read
    own_state: str | None  # the rank's own record of the chunk, if it has one

    def text(self) -> str:
        who = f"rank {self.rank}" + (f" ({self.node_id})" if self.node_id else "")
        line = (
            f"{who} never sent chunk {self.chunk_index} of op {self.op_id} "
            f"({self.kind}, group {self.group_id}, epoch {self.epoch}): {self.waiting_node} has waited "
            f"for it since {self.waiting_since_ms / 1000:.1f} s after it started"
        )
        if self.more_chunks:
            line += f"; {self.more_chunks} more chunks wait for this rank there"
        if not self.dumped:
            line += f"; no dump from rank {self.rank} (stopped, hung or unreachable?)"
        elif self.own_state is None:
            line += f"; rank {self.rank}'s own dump has no record of that chunk (it never got to it)"
        else:
            line += f"; rank {self.rank}'s own dump says the chunk is {self.own_state!r}"
            if self.own_state == "sent":
                line += " (lost between the rank and its aggregator?)"
        return line


@dataclass(frozen=True, slots=True)
class Analysis:
    owed: tuple[Owed, ...]
    nodes: tuple[str, ...]  # the nodes whose dumps were read
    waiting_endpoints: tuple[str, ...]  # endpoints with an operation still running

    def text(self) -> str:
        lines = [f"read the dumps of {len(self.nodes)} nodes: {', '.join(self.nodes)}"]
        if self.owed:
            lines += [owed.text() for owed in self.owed]
        elif self.waiting_endpoints:
            lines.append(
                f"{', '.join(self.waiting_endpoints)} wait for results, but no aggregator among these "
                "dumps waits for a rank: dump the aggregators of the group too"
            )
        else:
            lines.append("no chunk waits for a rank in these dumps")
        return "\n".join(lines)


def _key(record: dict[str, Any]) -> tuple[str, int, int, int]:
    return (record["group_id"], record["epoch"], record["op_id"], record["chunk_index"])


def analyze(dumps: Iterable[dict[str, Any]]) -> Analysis:
    """Name each rank that owes a chunk, from the dumps of any set of nodes."""
    dumps = list(dumps)
    below: dict[tuple[str, str], frozenset[int]] = {}  # (node, group) -> ranks below that aggregator
    names: dict[tuple[str, int], str] = {}  # (group, rank) -> node id
    own: dict[tuple[str, int], dict[tuple[str, int, int, int], str]] = {}  # (group, rank) -> chunk states
    waiting_endpoints = []
    for dump in dumps:
        node, role = dump["node_id"], dump["role"]
        for group in dump["groups"]:
            if role == "aggregator" and group["tree"]:
                below[(node, group["group_id"])] = frozenset(group["tree"][0]["ranks"])
            for member in group["members"]:
                names[(group["group_id"], member["rank"])] = member["node_id"]
                if role == "endpoint":
                    states = {_key(r): r["state"] for r in dump["records"] if r["chunk_index"] is not None}
                    own[(group["group_id"], member["rank"])] = states
        for group_id, children in dump.get("children", {}).items():
            for rank, child in children.items():
                names.setdefault((group_id, int(rank)), child)
        if role == "endpoint" and any(
            r["chunk_index"] is None and r["state"] == "running" for r in dump["records"]
        ):
            waiting_endpoints.append(node)
    # every aggregator's account of every chunk: (chunk, node) -> its record
    accounts: dict[tuple[str, int, int, int], dict[str, dict[str, Any]]] = {}
    for dump in dumps:
        if dump["role"] == "aggregator":
            for record in dump["records"]:
                if record["chunk_index"] is not None:
                    accounts.setdefault(_key(record), {})[dump["node_id"]] = record
    # a rank owes a chunk where the deepest aggregator with an account of it, among those
    # above the rank, still misses it (higher up it is missing because that one waits)
    owes: dict[tuple[str, int], list[tuple[tuple[str, int, int, int], str, dict[str, Any]]]] = {}
    for key, by_node in accounts.items():
        group_id = key[0]
        missing = {r for record in by_node.values() if record["state"] == WAITING for r in record["missing"]}
        for rank in sorted(missing):
            # the aggregators above the rank whose dumps were read (with or without an account)
            above = [n for (n, g), ranks in below.items() if g == group_id and rank in ranks]
            above += [n for n in by_node if (n, group_id) not in below]  # a dump without its place
            deepest = min(above, key=lambda n: (len(below.get((n, group_id), ())) or 1 << 30, n))
            record = by_node.get(deepest)  # none: the deepest got no part of it, its cause is elsewhere
            if record is not None and record["state"] == WAITING and rank in record["missing"]:
                owes.setdefault((group_id, rank), []).append((key, deepest, record))
    owed = []
    for (group_id, rank), found in sorted(owes.items()):
        key, node, record = min(found, key=lambda item: item[0])
        dumped = (group_id, rank) in own
        owed.append(
            Owed(
                rank=rank,
                node_id=names.get((group_id, rank)),
                group_id=group_id,
                epoch=record["epoch"],
                op_id=record["op_id"],
                chunk_index=record["chunk_index"],
                kind=record["kind"],
                waiting_node=node,
                waiting_since_ms=record["started_ms"],
                more_chunks=sum(1 for _, n, _ in found if n == node) - 1,
                dumped=dumped,
                own_state=own[(group_id, rank)].get(key) if dumped else None,
            )
        )
    return Analysis(
        owed=tuple(owed),
        nodes=tuple(sorted(dump["node_id"] for dump in dumps)),
        waiting_endpoints=tuple(sorted(waiting_endpoints)),
    )


def load_dumps(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The dumps in ``paths``: files, or directories whose ``flight-*.json`` files are read."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("flight-*.json")) if path.is_dir() else [path]
    dumps = []
    for file in files:
        try:
            dump = json.loads(file.read_text())
        except OSError as exc:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{file}: not JSON ({exc})") from None
        if not isinstance(dump, dict) or not {"node_id", "role", "groups", "records"} <= dump.keys():
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{file}: not a flight-recorder dump or status --json output"
            )
        dumps.append(dump)
    if not dumps:
        raise CcoError(
            ErrorCode.INVALID_FIELD, "no dumps found (flight-*.json files, or directories holding them)"
        )
    return dumps


def trace_main(argv: list[str], parser_class: type[argparse.ArgumentParser]) -> int:
    parser = parser_class(
        prog="cco-node trace-analyze",
        description="Read the flight-recorder dumps of the nodes of a hung job (written on SIGUSR1 "
        "into each node's state directory, or saved from `cco-node status --json`) and name each "
        "rank that owes a chunk, the operation and the chunk, and the aggregator waiting for it.",
    )
    parser.add_argument(
        "dumps", nargs="+", type=Path, metavar="DUMP", help="dump files, or directories of them"
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    analysis = analyze(load_dumps(args.dumps))
    if args.json:
        sys.stdout.write(
            json.dumps({"nodes": analysis.nodes, "owed": [asdict(o) for o in analysis.owed]}) + "\n"
        )
    else:
        sys.stdout.write(analysis.text() + "\n")
    return 0


__all__ = ["Analysis", "Owed", "analyze", "load_dumps", "trace_main"]
