"""What the rendezvous's SQLite store costs (issue 9: a rendezvous that survives a restart).

The rendezvous writes every durable change in one transaction before it sends the
messages that announce it, so the store's time is added to every join, leave and
re-plan, never to heartbeats or data.  Measured here, in one process, on a store file
in a temporary directory on this machine's disk (WAL, synchronous=FULL):

* one transaction: a formed group in which one member's row changes, median and p90
  of ``--saves`` saves;
* a change in a formed group (a member leaves: new epoch, new tree), with the store
  and without it, for groups of 4, 64 and 1024 ranks;
* forming a group (every member joining), with and without the store.

Budget (there is no target in the issue): a change in a formed group of 64 ranks
costs at most 10 ms with the store, a hundredth of the default heartbeat interval,
so a rendezvous of a few groups never delays a heartbeat by its writes.

    python benchmarks/probes/bench_rendezvous_store.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cco.nodes.events import Input, MessageReceived, PeerConnected
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.services.store import PersistentRendezvous, RendezvousStore
from cco.wire.errors import ErrorCode
from cco.wire.messages import Address, AggregatorRegister, JoinRequest, Leave
from cco.wire.registries import Role

RESULTS = Path(__file__).resolve().parent / "results" / "bench_rendezvous_store.json"
GROUP = bytes(range(16))
SIZES = ((4, 3), (64, 8), (1024, 80))  # (ranks, aggregators)
LEAVES = 5
BUDGET_MS = 10.0


class _Bare:
    """The machine alone, driven like the persistent one."""

    def __init__(self, machine: RendezvousMachine) -> None:
        self.machine = machine

    def handle(self, event: Input, now: float) -> object:
        return self.machine.handle(event, now)


@dataclass(frozen=True)
class Timing:
    forming_s: float
    leave_ms: float


def _drive(world: int, aggregators: int, store: RendezvousStore | None) -> Timing:
    machine = RendezvousMachine(
        RendezvousConfig(groups={GROUP: GroupConfig(world_size=world, credential=b"pw")})
    )
    node = PersistentRendezvous(machine, store) if store is not None else _Bare(machine)
    for i in range(aggregators):
        node.handle(PeerConnected(f"a{i}", f"agg-{i}", Role.AGGREGATOR), 0.0)
        register = AggregatorRegister(
            address=Address(host="agg", port=1000 + i), capacity=4, max_fan_in=16, labels=()
        )
        node.handle(MessageReceived(f"a{i}", register), 0.0)
    started = time.perf_counter()
    for rank in range(world):
        node.handle(PeerConnected(f"e{rank}", f"ep-{rank}", Role.ENDPOINT), 0.0)
        join = JoinRequest(group_id=GROUP, world_size=world, credential=b"pw", rank=rank, labels=())
        node.handle(MessageReceived(f"e{rank}", join), 0.0)
    forming = time.perf_counter() - started
    leaves = []
    for rank in range(world - 1, max(0, world - 1 - LEAVES), -1):
        started = time.perf_counter()
        node.handle(
            MessageReceived(f"e{rank}", Leave(group_id=GROUP, rank=rank, code=ErrorCode.NO_ERROR)), 0.0
        )
        leaves.append(time.perf_counter() - started)
    return Timing(forming, statistics.median(leaves) * 1000)


def _transactions(directory: Path, saves: int) -> tuple[float, float]:
    """Median and p90 of a join that adds one member row (the machine's time and one
    transaction), in ms."""
    store = RendezvousStore(directory / "one-row.sqlite3")
    node = PersistentRendezvous(
        RendezvousMachine(
            RendezvousConfig(groups={GROUP: GroupConfig(world_size=saves + 1, credential=b"pw")})
        ),
        store,
    )
    node.handle(PeerConnected("a0", "agg-0", Role.AGGREGATOR), 0.0)
    times = []
    for rank in range(saves):  # each join adds one member row: one small transaction
        node.handle(PeerConnected(f"e{rank}", f"ep-{rank}", Role.ENDPOINT), 0.0)
        join = JoinRequest(group_id=GROUP, world_size=saves + 1, credential=b"pw", rank=rank, labels=())
        before = store.transactions
        started = time.perf_counter()
        node.handle(MessageReceived(f"e{rank}", join), 0.0)
        times.append(time.perf_counter() - started)
        assert store.transactions == before + 1, "one transaction per change"
    store.close()
    times.sort()
    return statistics.median(times) * 1000, times[int(0.9 * len(times))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--saves", type=int, default=300, help="transactions timed for the per-save figure")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        median, p90 = _transactions(directory, args.saves)
        print(
            f"a join, saved in one transaction (one member row): median {median:.2f} ms, p90 {p90:.2f} ms "
            f"({args.saves} joins, the machine's time included)"
        )
        rows = []
        for world, aggregators in SIZES:
            store = RendezvousStore(directory / f"group-{world}.sqlite3")
            stored = _drive(world, aggregators, store)
            store.close()
            bare = _drive(world, aggregators, None)
            rows.append(
                {
                    "ranks": world,
                    "aggregators": aggregators,
                    "leave_ms_store": stored.leave_ms,
                    "leave_ms_bare": bare.leave_ms,
                    "forming_s_store": stored.forming_s,
                    "forming_s_bare": bare.forming_s,
                }
            )
            print(
                f"{world:5d} ranks, {aggregators:2d} aggregators: a member leaves {stored.leave_ms:8.2f} ms "
                f"(without store {bare.leave_ms:7.2f} ms); forming {stored.forming_s * 1000:7.1f} ms "
                f"(without {bare.forming_s * 1000:6.1f} ms)"
            )
    budget = next(r for r in rows if r["ranks"] == 64)["leave_ms_store"]
    verdict = "met" if budget <= BUDGET_MS else "missed"
    what = f"a change in a formed 64-rank group <= {BUDGET_MS:g} ms with the store"
    print(f"budget: {what}: {budget:.2f} ms, {verdict}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "transaction_ms": {"median": median, "p90": p90},
        "groups": rows,
        "budget_met": verdict == "met",
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
