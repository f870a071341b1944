"""The rendezvous's durable store: its groups and registrations in SQLite.

A rendezvous that restarts must find every group as it was (members and their ranks,
epoch, secret, parameters, tree) and every aggregator registration, or the groups die
with it (draft section "Rendezvous Persistence and Restart").  The sans-I/O machine
exports what must survive as a :class:`~cco.nodes.rendezvous.DurableState` and
counts its changes in ``durable_version``; this module keeps that state in one SQLite
file and puts the two together:

* :class:`RendezvousStore` opens (or creates) the file, checks that it is a CCO
  rendezvous store of a schema version this build reads, loads the state and saves
  each new state in *one* transaction that writes only the rows that changed.
* :class:`PersistentRendezvous` wraps the machine for the service: after every input
  whose handling changed the durable state, it saves the state *before* it hands
  back the commands that announce the change, so a peer never holds an epoch, rank
  or secret that a restart would not find.  Heartbeats change nothing and write
  nothing.  If a save fails, the rendezvous can no longer keep that promise: the
  wrapper withholds the commands, reports the failure and stops answering, and the
  service exits (a service manager restarts it from the last saved state).

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`, ``PRAGMA application_id`` =
:data:`APPLICATION_ID`; structured values are deterministic CBOR, parameters and
capabilities in their wire form)::

    groups(group_id BLOB PK, world_size, credential BLOB, secret BLOB, epoch,
           state TEXT, change_code, max_fan_in, params BLOB, tree BLOB NULL)
    members(group_id BLOB, rank, node_id TEXT, state TEXT, epoch, labels BLOB,
            capabilities BLOB NULL; PK (group_id, rank))
    aggregators(node_id TEXT PK, host TEXT, port, capacity, max_fan_in, labels BLOB,
                capabilities BLOB NULL)
    exclusions(group_id BLOB, position, node_id TEXT; PK (group_id, position))

An exclusion is an aggregator a member's Report took out of a group's trees
(:mod:`cco.nodes.rendezvous_reports`), ``position`` 0 the oldest.  A store of schema
version 1, which predates them, is brought to version 2 when it is opened: the
table is added, empty.

The file holds group credentials and secrets: it is created readable by its owner
only, in a directory of its owner's.  The connection holds SQLite's exclusive lock
for its whole life, so a second rendezvous on the same file fails at start with a
clear error instead of overwriting the first one's state.  Writes are synchronous
(WAL, ``synchronous=FULL``): a change is on disk before anyone hears of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cco.nodes.events import Command, Input
from cco.nodes.rendezvous import RendezvousMachine
from cco.nodes.rendezvous_durable import DurableAggregator, DurableGroup, DurableMember, DurableState
from cco.nodes.rendezvous_states import GroupState, MemberState
from cco.nodes.tree import AggregatorInfo, AggregatorPlacement, PlanStrategy, TreePlan
from cco.wire import cbor
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address, Capabilities, GroupParams, NodeRef

MEMORY = ":memory:"
"""The store path that keeps nothing across a restart."""
SCHEMA_VERSION = 2
APPLICATION_ID = 0x43434F52
"""``PRAGMA application_id`` of a rendezvous store ("CCOR"), so that a foreign SQLite
file is recognised as such instead of being read as an empty store."""

_EXCLUSIONS = """CREATE TABLE exclusions (
    group_id BLOB NOT NULL, position INTEGER NOT NULL, node_id TEXT NOT NULL,
    PRIMARY KEY (group_id, position)) STRICT"""
"""The table schema version 2 added to version 1."""
_SCHEMA = (
    """CREATE TABLE groups (
        group_id BLOB PRIMARY KEY, world_size INTEGER NOT NULL, credential BLOB NOT NULL,
        secret BLOB NOT NULL, epoch INTEGER NOT NULL, state TEXT NOT NULL,
        change_code INTEGER NOT NULL, max_fan_in INTEGER NOT NULL, params BLOB NOT NULL,
        tree BLOB) STRICT""",
    """CREATE TABLE members (
        group_id BLOB NOT NULL, rank INTEGER NOT NULL, node_id TEXT NOT NULL,
        state TEXT NOT NULL, epoch INTEGER NOT NULL, labels BLOB NOT NULL, capabilities BLOB,
        PRIMARY KEY (group_id, rank)) STRICT""",
    """CREATE TABLE aggregators (
        node_id TEXT PRIMARY KEY, host TEXT NOT NULL, port INTEGER NOT NULL,
        capacity INTEGER NOT NULL, max_fan_in INTEGER NOT NULL, labels BLOB NOT NULL,
        capabilities BLOB) STRICT""",
    _EXCLUSIONS,
)
_TABLES = {
    "groups": ("group_id",),
    "members": ("group_id", "rank"),
    "aggregators": ("node_id",),
    "exclusions": ("group_id", "position"),
}

Row = tuple[Any, ...]


class StoreError(CcoError):
    """The store cannot be opened, read or written; the detail names the file."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, f"rendezvous store {path}: {detail}")


class RendezvousStore:
    """One SQLite file (or :data:`MEMORY`) holding one rendezvous's durable state."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.transactions = 0
        """Transactions committed by :meth:`save` (one per saved change)."""
        self._rows: dict[str, dict[Row, Row]] = {table: {} for table in _TABLES}
        self._trees: dict[bytes, tuple[TreePlan, bytes]] = {}  # the last tree encoded, per group
        if self.path != MEMORY:
            _create_private(Path(self.path))
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=0.0)
        except sqlite3.Error as exc:
            raise StoreError(self.path, f"cannot open: {exc}") from None
        try:
            self._open()
        except sqlite3.OperationalError as exc:
            self._db.close()
            if "locked" in str(exc):
                raise StoreError(self.path, "in use by another process (another rendezvous?)") from None
            raise StoreError(self.path, f"cannot open: {exc}") from None
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(self.path, f"not a CCO rendezvous store ({exc})") from None
        except StoreError:
            self._db.close()
            raise

    def _open(self) -> None:
        db = self._db
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        application_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if application_id == 0 and not tables:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        elif application_id != APPLICATION_ID:
            raise StoreError(self.path, f"not a CCO rendezvous store (application_id {application_id:#x})")
        elif version == 1 and tables == set(_TABLES) - {"exclusions"}:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")  # takes the lock now, held until close()
            db.execute(_EXCLUSIONS)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        elif version != SCHEMA_VERSION:
            raise StoreError(
                self.path, f"schema version {version}; this build reads version {SCHEMA_VERSION}"
            )
        elif tables != set(_TABLES):
            raise StoreError(self.path, f"tables {sorted(tables)}, expected {sorted(_TABLES)}")
        else:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")  # takes the lock now, held until close()
            db.execute("COMMIT")
        db.execute("PRAGMA synchronous=FULL")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def load(self) -> DurableState:
        """The state last saved (empty for a new store).  A row that does not decode
        raises :class:`StoreError`."""
        try:
            for table, key in _TABLES.items():
                self._rows[table] = {
                    row[: len(key)]: row for row in self._db.execute(f"SELECT * FROM {table}")
                }
            return _state_from_rows(self._rows)
        except (CcoError, ValueError, KeyError, TypeError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreError(self.path, f"corrupt: {exc}") from None

    def save(self, state: DurableState) -> None:
        """Write ``state`` in one transaction: only rows that differ from what is
        stored are written or deleted; with no difference nothing is written."""
        new = self._rows_from_state(state)
        changes = [(table, *_diff(self._rows[table], new[table])) for table in _TABLES]
        if not any(upserts or deletes for _, upserts, deletes in changes):
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for table, upserts, deletes in changes:
                key = _TABLES[table]
                if deletes:
                    where = " AND ".join(f"{column} = ?" for column in key)
                    self._db.executemany(f"DELETE FROM {table} WHERE {where}", deletes)
                if upserts:
                    marks = ", ".join("?" * len(upserts[0]))
                    self._db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", upserts)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise StoreError(self.path, f"write failed: {exc}") from None
        self._rows = new
        self.transactions += 1

    def close(self) -> None:
        self._db.close()

    def _tree_blob(self, group_id: bytes, plan: TreePlan | None) -> bytes | None:
        """A tree is encoded once: the machine keeps the same plan object until it
        re-plans, and a large group's tree is the largest value in the store."""
        if plan is None:
            return None
        cached = self._trees.get(group_id)
        if cached is None or cached[0] is not plan:
            cached = (plan, _encode_tree(plan))
            self._trees[group_id] = cached
        return cached[1]

    def _rows_from_state(self, state: DurableState) -> dict[str, dict[Row, Row]]:
        rows: dict[str, dict[Row, Row]] = {table: {} for table in _TABLES}
        for g in state.groups:
            rows["groups"][(g.group_id,)] = (
                g.group_id,
                g.world_size,
                g.credential,
                g.secret,
                g.epoch,
                g.state.value,
                int(g.change_code),
                g.max_fan_in,
                _params_blob(g.params),
                self._tree_blob(g.group_id, g.plan),
            )
            for m in g.members:
                rows["members"][(g.group_id, m.rank)] = (
                    g.group_id,
                    m.rank,
                    m.node_id,
                    m.state.value,
                    m.epoch,
                    _labels_blob(m.labels),
                    _capabilities_blob(m.capabilities),
                )
            for position, node_id in enumerate(g.excluded):
                rows["exclusions"][(g.group_id, position)] = (g.group_id, position, node_id)
        for a in state.aggregators:
            info = a.info
            rows["aggregators"][(info.node_id,)] = (
                info.node_id,
                info.address.host,
                info.address.port,
                info.capacity,
                info.max_fan_in,
                _labels_blob(info.labels),
                _capabilities_blob(a.capabilities),
            )
        self._trees = {g.group_id: self._trees[g.group_id] for g in state.groups if g.plan is not None}
        return rows


def _create_private(path: Path) -> None:
    """Make the directory (owner only, if new) and the file (owner read/write) up front,
    so that SQLite never creates a store readable by others."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as exc:
        raise StoreError(str(path), f"cannot create: {exc.strerror}") from None


def _diff(old: dict[Row, Row], new: dict[Row, Row]) -> tuple[list[Row], list[Row]]:
    upserts = [row for key, row in new.items() if old.get(key) != row]
    deletes = [key for key in old if key not in new]
    return upserts, deletes


# --- rows <-> state ----------------------------------------------------------------


def _blob(value: cbor.CborValue) -> bytes:
    return cbor.encode(value)


# Labels, capabilities and parameters repeat across members and saves: each distinct
# value is encoded once (they are frozen, hence hashable).


@functools.lru_cache(maxsize=1024)
def _labels_blob(labels: tuple[str, ...]) -> bytes:
    return _blob(list(labels))


@functools.lru_cache(maxsize=1024)
def _capabilities_blob(capabilities: Capabilities | None) -> bytes | None:
    return None if capabilities is None else _blob(capabilities.to_map())


@functools.lru_cache(maxsize=1024)
def _params_blob(params: GroupParams) -> bytes:
    return _blob(params.to_map())


def _ref(ref: NodeRef) -> cbor.CborValue:
    return ref.to_map()


def _encode_tree(plan: TreePlan) -> bytes:
    placements: list[cbor.CborValue] = [
        [_ref(p.node), None if p.parent is None else _ref(p.parent), [_ref(c) for c in p.children], p.depth]
        for p in plan.aggregators
    ]
    parents: list[cbor.CborValue] = [[rank, _ref(ref)] for rank, ref in plan.endpoint_parents]
    return _blob([plan.strategy.value, plan.locality, placements, parents])


def _decoded(blob: bytes) -> Any:
    return cbor.decode(blob)


def _labels(blob: bytes) -> tuple[str, ...]:
    labels = _decoded(blob)
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError("labels are not a list of text")
    return tuple(labels)


def _capabilities(blob: bytes | None) -> Capabilities | None:
    return None if blob is None else Capabilities.from_map(_decoded(blob))


def _tree(blob: bytes | None) -> TreePlan | None:
    if blob is None:
        return None
    strategy, locality, placements, parents = _decoded(blob)
    return TreePlan(
        strategy=PlanStrategy(strategy),
        aggregators=tuple(
            AggregatorPlacement(
                node=NodeRef.from_map(node),
                parent=None if parent is None else NodeRef.from_map(parent),
                children=tuple(NodeRef.from_map(child) for child in children),
                depth=int(depth),
            )
            for node, parent, children, depth in placements
        ),
        endpoint_parents=tuple((int(rank), NodeRef.from_map(ref)) for rank, ref in parents),
        locality=int(locality),
    )


def _state_from_rows(rows: dict[str, dict[Row, Row]]) -> DurableState:
    members: dict[bytes, list[DurableMember]] = {}
    for group_id, rank, node_id, state, epoch, labels, capabilities in sorted(rows["members"].values()):
        members.setdefault(group_id, []).append(
            DurableMember(
                rank, node_id, _labels(labels), _capabilities(capabilities), MemberState(state), epoch
            )
        )
    excluded: dict[bytes, list[str]] = {}
    for group_id, _, node_id in sorted(rows["exclusions"].values()):
        excluded.setdefault(group_id, []).append(node_id)
    groups = tuple(
        DurableGroup(
            group_id=group_id,
            world_size=world_size,
            credential=credential,
            secret=secret,
            epoch=epoch,
            params=GroupParams.from_map(_decoded(params)),
            max_fan_in=max_fan_in,
            state=GroupState(state),
            change_code=ErrorCode(change_code),
            members=tuple(members.pop(group_id, [])),
            plan=_tree(tree),
            excluded=tuple(excluded.pop(group_id, [])),
        )
        for (
            group_id,
            world_size,
            credential,
            secret,
            epoch,
            state,
            change_code,
            max_fan_in,
            params,
            tree,
        ) in (sorted(rows["groups"].values()))
    )
    if members or excluded:
        strays = sorted(g.hex() for g in {*members, *excluded})
        raise ValueError(f"members or exclusions of groups that are not stored: {strays}")
    aggregators = tuple(
        DurableAggregator(
            AggregatorInfo(node_id, Address(host=host, port=port), capacity, max_fan_in, _labels(labels)),
            _capabilities(capabilities),
        )
        for node_id, host, port, capacity, max_fan_in, labels, capabilities in sorted(
            rows["aggregators"].values()
        )
    )
    return DurableState(groups=groups, aggregators=aggregators)


# --- the machine with its store ----------------------------------------------------


class PersistentRendezvous:
    """A :class:`RendezvousMachine` whose every durable change is saved before the
    commands announcing it are handed to the runner (the runner's ``Machine``)."""

    def __init__(
        self,
        machine: RendezvousMachine,
        store: RendezvousStore,
        on_failure: Callable[[StoreError], None] = lambda error: None,
    ) -> None:
        self.machine = machine
        self.store = store
        self.on_failure = on_failure
        self.failure: StoreError | None = None
        store.save(machine.durable_state())  # groups of the configuration, new since the last run
        self._saved = machine.durable_version

    @classmethod
    def open(
        cls,
        store: RendezvousStore,
        build: Callable[[DurableState], RendezvousMachine],
        on_failure: Callable[[StoreError], None] = lambda error: None,
    ) -> PersistentRendezvous:
        """The machine ``build`` makes from the stored state, with the store."""
        state = store.load()
        try:
            machine = build(state)
        except ValueError as exc:
            raise StoreError(store.path, f"inconsistent: {exc}") from None
        return cls(machine, store, on_failure)

    def handle(self, event: Input, now: float) -> list[Command]:
        if self.failure is not None:
            return []
        commands = self.machine.handle(event, now)
        if self.machine.durable_version != self._saved:
            try:
                self.store.save(self.machine.durable_state())
            except StoreError as exc:
                self.failure = exc
                self.on_failure(exc)
                return []
            self._saved = self.machine.durable_version
        return commands

    def next_deadline(self) -> float | None:
        return None if self.failure is not None else self.machine.next_deadline()


def stored_groups(state: DurableState) -> Iterable[str]:
    """One line per stored group, for the log at start."""
    for g in state.groups:
        members = f"{len(g.members)}/{g.world_size} members"
        yield f"group {g.group_id.hex()} epoch {g.epoch} {g.state.value}: {members}"


__all__ = [
    "APPLICATION_ID",
    "MEMORY",
    "SCHEMA_VERSION",
    "PersistentRendezvous",
    "RendezvousStore",
    "StoreError",
    "stored_groups",
]
