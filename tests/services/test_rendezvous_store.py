"""The rendezvous store: SQLite files written and read back, one transaction per
change, saved before anyone hears of the change, and clear errors for files that
are not a store of ours (draft section "Rendezvous Persistence and Restart")."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from rendezvous_harness import GID, GRACE, Harness, VersionedHarness, formed

from cco import config
from cco.localcluster import free_udp_port
from cco.nodes.events import Command, Input, MessageReceived, PeerDisconnected
from cco.nodes.rendezvous import RendezvousMachine
from cco.nodes.rendezvous_durable import DurableState
from cco.services.store import (
    APPLICATION_ID,
    MEMORY,
    SCHEMA_VERSION,
    PersistentRendezvous,
    RendezvousStore,
    StoreError,
)
from cco.transport import create_dev_pki
from cco.transport.certs import CA_CERT_FILE, load_certificate
from cco.wire.errors import ErrorCode
from cco.wire.messages import Capabilities, Heartbeat, Leave
from cco.wire.registries import Collective, DType, ReduceOp, Role


def a_state() -> DurableState:
    """A state with everything in it: groups with trees, members, registrations,
    capabilities on members and aggregators, and aggregators excluded by Reports."""
    h = formed(aggregators=3)
    caps = Capabilities(
        dtypes=(DType.INT32,),
        ops=(ReduceOp.SUM,),
        collectives=tuple(Collective),
        max_message_size=1 << 20,
        max_chunk_elements=4096,
        extensions=(7,),
    )
    state = h.rv.durable_state()
    group = state.groups[0]
    members = (dataclasses.replace(group.members[0], capabilities=caps), *group.members[1:])
    aggregator = dataclasses.replace(state.aggregators[0], capabilities=caps)
    return DurableState(
        groups=(dataclasses.replace(group, members=members, excluded=("gone-2", "gone-1")),),
        aggregators=(aggregator, *state.aggregators[1:]),
    )


def test_a_state_written_to_a_file_reads_back_equal(tmp_path: Path) -> None:
    state = a_state()
    assert state.groups[0].plan is not None and state.groups[0].members[0].capabilities is not None
    path = tmp_path / "deep" / "rv.sqlite3"
    store = RendezvousStore(path)
    assert store.load() == DurableState()
    store.save(state)
    store.close()
    again = RendezvousStore(path)
    assert again.load() == state
    again.close()


def test_the_file_records_its_schema_version_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "rv.sqlite3"
    RendezvousStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds group secrets
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_saving_writes_only_what_changed_in_one_transaction() -> None:
    store = RendezvousStore(MEMORY)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    state = a_state()
    store.save(state)
    assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
    assert sum(s.startswith("BEGIN") for s in statements) == 1
    statements.clear()
    store.save(state)  # nothing changed: nothing written
    assert statements == [] and store.transactions == 1
    group = state.groups[0]
    fewer = dataclasses.replace(
        state, groups=(dataclasses.replace(group, members=group.members[:3], epoch=group.epoch + 1),)
    )
    store.save(fewer)
    writes = [s for s in statements if s.startswith(("INSERT", "DELETE"))]
    assert len(writes) == 2 and any("members" in w for w in writes if w.startswith("DELETE"))
    assert sum(s.startswith("BEGIN") for s in statements) == 1 and store.transactions == 2
    assert store.load() == fewer


def test_each_change_is_stored_before_its_commands_are_handed_out_and_heartbeats_write_nothing() -> None:
    h = VersionedHarness()  # group GID of 4
    store = RendezvousStore(MEMORY)
    persistent = PersistentRendezvous(h.rv, store)
    saved: list[int] = []

    def feed(event: Input) -> list[Command]:
        before = store.transactions
        cmds = persistent.handle(event, h.now)
        # whatever the commands announce, the store holds already: all the machine knows
        assert store.load() == persistent.machine.durable_state()
        saved.append(store.transactions - before)
        return cmds

    h.rv = persistent  # type: ignore[assignment]
    h.feed = feed  # type: ignore[method-assign]
    h.aggregator("a0", capacity=1, fan_in=4)
    h.aggregator("a1", capacity=1, fan_in=4)
    for i in range(4):
        h.endpoint(f"e{i}")
    assert saved == [0, 1] * 6  # connections write nothing; each registration and join once
    tree = persistent.machine.status().groups[0].tree
    assert tree is not None
    saved.clear()
    for _ in range(3):
        for peer in ("a0", "a1", "e0", "e1", "e2", "e3"):
            h.send(peer, Heartbeat(seq=1))
        h.tick(1.0)
    assert saved == [0] * 21
    saved.clear()
    (used,) = tree.aggregator_ids
    h.feed(PeerDisconnected(used, ErrorCode.PEER_LOST))  # re-planned onto the other one
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    assert saved == [1, 1]
    replanned = persistent.machine.status().groups[0].tree
    assert replanned is not None and replanned.aggregator_ids == {"a0", "a1"} - {used}


def test_a_failed_save_withholds_the_commands_and_stops_the_machine() -> None:
    h = Harness()
    store = RendezvousStore(MEMORY)
    failures: list[StoreError] = []
    persistent = PersistentRendezvous(h.rv, store, failures.append)
    store._db.set_authorizer(lambda *args: sqlite3.SQLITE_DENY)  # every statement fails from now on
    h.rv = persistent  # type: ignore[assignment]
    assert h.endpoint("e0") == []  # the JoinAccept is not handed out: it is not stored
    assert len(failures) == 1 and "write failed" in failures[0].detail
    assert persistent.next_deadline() is None
    assert persistent.handle(MessageReceived("e0", Heartbeat(seq=2)), 1.0) == []


def test_a_restored_machine_from_the_store_resumes_its_members(tmp_path: Path) -> None:
    h = formed()
    path = tmp_path / "rv.sqlite3"
    store = RendezvousStore(path)
    store.save(h.rv.durable_state())
    store.close()  # the process dies
    store = RendezvousStore(path)
    config = h.config
    persistent = PersistentRendezvous.open(
        store, lambda state: RendezvousMachine.restored(state, 50.0, config)
    )
    assert persistent.machine.status().grace_ends == pytest.approx(50.0 + GRACE)
    assert persistent.machine.durable_state() == h.rv.durable_state()
    store.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not a database, it is text" * 100, "not a CCO rendezvous store"),
        (b"", None),  # an empty file is a new store
    ],
)
def test_a_file_that_is_not_a_store_is_refused_clearly(
    tmp_path: Path, content: bytes, message: str | None
) -> None:
    path = tmp_path / "rv.sqlite3"
    path.write_bytes(content)
    if message is None:
        RendezvousStore(path).close()
        return
    with pytest.raises(StoreError, match=message):
        RendezvousStore(path)


def test_a_foreign_sqlite_file_and_a_newer_schema_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite3"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE photos (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=r"not a CCO rendezvous store \(application_id 0x0\)"):
        RendezvousStore(foreign)
    newer = tmp_path / "newer.sqlite3"
    RendezvousStore(newer).close()
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        RendezvousStore(newer)


def test_a_version_1_store_gains_the_exclusions_table_and_keeps_its_groups(tmp_path: Path) -> None:
    path = tmp_path / "rv.sqlite3"
    state = a_state()
    old = dataclasses.replace(state, groups=tuple(dataclasses.replace(g, excluded=()) for g in state.groups))
    store = RendezvousStore(path)
    store.save(old)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE exclusions")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    store = RendezvousStore(path)
    assert store.schema_version == SCHEMA_VERSION == 2
    assert store.load() == old
    store.save(state)
    store.close()
    again = RendezvousStore(path)
    assert again.load() == state
    again.close()


def test_a_corrupt_row_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "rv.sqlite3"
    store = RendezvousStore(path)
    store.save(a_state())
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE groups SET params = x'ff00'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="corrupt"):
        RendezvousStore(path).load()


def test_an_inconsistent_state_is_refused_when_the_machine_is_built(tmp_path: Path) -> None:
    path = tmp_path / "rv.sqlite3"
    store = RendezvousStore(path)
    store.save(a_state())
    store._db.execute("DELETE FROM aggregators")  # the tree now names unregistered aggregators
    with pytest.raises(StoreError, match="inconsistent"):
        PersistentRendezvous.open(store, lambda state: RendezvousMachine.restored(state, 0.0))
    store.close()


def test_a_store_in_use_by_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rv.sqlite3"
    store = RendezvousStore(path)
    script = "from cco.services.store import RendezvousStore as S, StoreError as E\n"
    script += f"try:\n    S({str(path)!r})\nexcept E as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert "in use by another process" in out.stdout
    store.close()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout == "" and out.returncode == 0


def test_the_rendezvous_process_refuses_a_bad_store_in_one_line(tmp_path: Path) -> None:
    create_dev_pki(tmp_path / "pki", [("rendezvous", Role.RENDEZVOUS)])
    bad = tmp_path / "bad.sqlite3"
    bad.write_bytes(b"garbage" * 1000)
    argv = ["--role", "rendezvous", "--node-id", "rendezvous", "--pki-dir", str(tmp_path / "pki")]
    argv += ["--listen", f"127.0.0.1:{free_udp_port()}", "--store", str(bad)]
    out = subprocess.run(
        [sys.executable, "-m", "cco.cli", *argv], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"cco-node: INTERNAL_ERROR (0x01): rendezvous store {bad}: not a CCO rendezvous store "
        "(file is not a database)"
    ]


def test_the_rendezvous_option_is_documented() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cco.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--store" in out.stdout and ":memory:" in out.stdout and "--resume-grace-ms" in out.stdout


def test_the_rendezvous_process_keeps_its_store_in_the_default_place(tmp_path: Path) -> None:
    create_dev_pki(tmp_path / "pki", [("rendezvous", Role.RENDEZVOUS)])
    env = {k: v for k, v in os.environ.items() if k != "CCO_STORE"} | {
        "XDG_STATE_HOME": str(tmp_path / "state")
    }
    argv = ["--role", "rendezvous", "--node-id", "rendezvous", "--pki-dir", str(tmp_path / "pki")]
    listen = f"127.0.0.1:{free_udp_port()}"
    log = tmp_path / "rendezvous.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "cco.cli", *argv, "--listen", listen],
            stderr=handle,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while "listening" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0
    ca = load_certificate(tmp_path / "pki" / CA_CERT_FILE).fingerprint(hashes.SHA256()).hex()
    expected = config.default_store_path("rendezvous", listen, ca, env)
    assert expected.parent == tmp_path / "state" / "cco"
    assert f"store {expected})" in log.read_text()
    assert RendezvousStore(expected).load() == DurableState()
