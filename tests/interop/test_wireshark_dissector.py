"""The Wireshark dissector (interop/wireshark/cco.lua) decodes every CCO message type.

A capture on loopback, filtered to this test's own ports, holds a live cluster run
(a rendezvous and three aggregators as ``cco-node`` processes, forming a two-level
tree for four ranks that run every collective, and a fifth refused for a wrong
credential) and one connection that sends every message of
``interop/vectors/messages.json`` (the types a healthy run never sends: Error,
ChunkAck, RetransmitRequest, Abort).  Every node appends its TLS secrets to one key
log.  tshark, with the dissector and the key log, must then show every message type,
each with every field its type always carries.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cco.client import Communicator, GroupSpec
from cco.interop.samples import FULL_CAPABILITIES
from cco.localcluster import free_udp_port
from cco.transport import LocalIdentity, PeerLink, TransportConfig, connect, serve
from cco.transport.certs import create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import MESSAGE_CLASSES, Hello, HelloAck, decode_message
from cco.wire.registries import Role

REPO = Path(__file__).resolve().parents[2]
WIRESHARK = REPO / "interop" / "wireshark"
GROUP = "c0" * 16

pytestmark = pytest.mark.skipif(
    shutil.which("tshark") is None or shutil.which("dumpcap") is None,
    reason="tshark is not installed (scripts/system-deps installs Debian's tshark package)",
)


def test_the_generated_registry_block_is_fresh() -> None:
    """The dissector's tables are those of cco/wire: regenerate them when the wire changes."""
    check = [sys.executable, str(WIRESHARK / "make_registry.py"), "--check"]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _wait_for(path: Path, needle: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while needle not in (path.read_text() if path.exists() else ""):
        assert process.poll() is None, f"{path.name}: exited with {process.returncode}: {path.read_text()}"
        assert time.monotonic() < deadline, f"{path.name}: no {needle!r} within {timeout} s"
        time.sleep(0.05)


class Nodes:
    """``cco-node`` processes with logs in one directory, all stopped at the end."""

    def __init__(self, directory: Path, keylog: Path) -> None:
        self.directory = directory
        self.environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
        self.environ |= {"CCO_KEYLOG_FILE": str(keylog), "PYTHONUNBUFFERED": "1"}
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, name: str, *args: str) -> tuple[subprocess.Popen[str], Path]:
        log = self.directory / f"{name}.log"
        with open(log, "w") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "cco", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.environ,
            )
        self.processes.append(process)
        return process, log

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_cluster(pki: Path, workdir: Path, keylog: Path, ports: dict[str, int]) -> None:
    """The rendezvous and three aggregators as ``cco-node`` processes; the four ranks
    (and the refused fifth) in this process, so that they join together however
    slowly a loaded machine starts processes."""
    nodes = Nodes(workdir, keylog)
    common = ["--pki-dir", str(pki), "--max-datagram-size", "1452"]
    rendezvous = f"127.0.0.1:{ports['rendezvous']}"
    try:
        process, log = nodes.start(
            "rendezvous",
            *("--role", "rendezvous", "--node-id", "rendezvous", *common, "--listen", rendezvous),
            *("--store", ":memory:", "--dynamic-groups", "false", "--group-id", GROUP),
            *("--world-size", "4", "--credential", "right", "--chunk-elements", "16"),
        )
        _wait_for(log, "listening", process)
        for i in range(3):
            process, log = nodes.start(
                f"agg-{i}",
                *("--role", "aggregator", "--node-id", f"agg-{i}", *common),
                *(
                    "--listen",
                    f"127.0.0.1:{ports[f'agg-{i}']}",
                    "--rendezvous",
                    rendezvous,
                    "--max-fan-in",
                    "2",
                ),
            )
            _wait_for(log, "registered", process)
        asyncio.run(asyncio.wait_for(every_collective(pki, keylog, rendezvous), 240))
    finally:
        nodes.stop()


async def every_collective(pki: Path, keylog: Path, rendezvous: str) -> None:
    def spec(rank: int | None, credential: bytes) -> GroupSpec:
        group = bytes.fromhex(GROUP)
        return GroupSpec(
            group_id=group, world_size=4, credential=credential, rank=rank, rendezvous=rendezvous
        )

    def transport(node_id: str) -> TransportConfig:
        return TransportConfig.for_node(pki, node_id, keylog_file=keylog)

    comms = await asyncio.gather(
        *(
            Communicator.join(spec(rank, b"right"), f"ep-{rank}", transport(f"ep-{rank}"), timeout=120)
            for rank in range(4)
        )
    )
    try:
        data = [np.arange(8, dtype=np.float32) + comm.rank for comm in comms]
        await asyncio.gather(*(comm.all_reduce(x) for comm, x in zip(comms, data, strict=True)))
        await asyncio.gather(*(comm.reduce(x, root=0) for comm, x in zip(comms, data, strict=True)))
        await asyncio.gather(*(comm.broadcast(x, root=1) for comm, x in zip(comms, data, strict=True)))
        await asyncio.gather(*(comm.all_gather(x) for comm, x in zip(comms, data, strict=True)))
        await asyncio.gather(*(comm.reduce_scatter(x) for comm, x in zip(comms, data, strict=True)))
        await asyncio.gather(*(comm.barrier() for comm in comms))
        with pytest.raises(CcoError) as refused:
            await Communicator.join(spec(None, b"wrong"), "ep-4", transport("ep-4"), timeout=60)
        assert refused.value.code is ErrorCode.BAD_CREDENTIAL
    finally:
        await asyncio.gather(*(comm.close() for comm in comms))


def send_every_vector(pki: Path, keylog: Path, port: int) -> None:
    """One connection carrying every message of the vectors (but Hello and HelloAck,
    which its own handshake has), as a peer would send them."""
    vectors = json.loads((REPO / "interop" / "vectors" / "messages.json").read_text())
    messages = [decode_message(bytes.fromhex(vector["encoded"])) for vector in vectors]

    async def parade() -> None:
        received: asyncio.Queue[PeerLink] = asyncio.Queue()
        server_config = TransportConfig.for_node(pki, "agg-0", keylog_file=keylog)
        identity = LocalIdentity("agg-0", Role.AGGREGATOR, FULL_CAPABILITIES)
        server = await serve("127.0.0.1", port, server_config, identity, received.put_nowait)
        try:
            client_config = TransportConfig.for_node(pki, "ep-0", keylog_file=keylog)
            client = LocalIdentity("ep-0", Role.ENDPOINT, FULL_CAPABILITIES)
            link = await connect("127.0.0.1", port, client_config, client, "agg-0", timeout=10)
            for message in messages:
                if not isinstance(message, Hello | HelloAck):
                    # each in packets of its own: tshark 4.0's QUIC drops a message that
                    # straddles two packets after another one (interop/wireshark/README.md)
                    link.send(message)
                    link.flush()
                    await link.drain()
            await asyncio.sleep(0.5)  # let the last packets leave before the capture stops
            link.close()
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(parade(), 60))


class Capture:
    """dumpcap on loopback for the given UDP ports, as classic pcap."""

    def __init__(self, path: Path, ports: list[int]) -> None:
        self.path = path
        port_filter = " or ".join(f"udp port {port}" for port in ports)
        self.process = subprocess.Popen(
            ["dumpcap", "-q", "-P", "-i", "lo", "-f", port_filter, "-w", str(path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline()  # "Capturing on 'Loopback: lo'" once it captures
        assert "Capturing on" in line, line

    def stop(self) -> None:
        time.sleep(0.5)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, list[str]]]]:
    """Per packet, the values of every cco.* field tshark showed."""
    workdir = tmp_path_factory.mktemp("wireshark")
    pki, keylog = workdir / "pki", workdir / "keys.log"
    create_dev_pki(
        pki,
        [("rendezvous", Role.RENDEZVOUS)]
        + [(f"agg-{i}", Role.AGGREGATOR) for i in range(3)]
        + [(f"ep-{i}", Role.ENDPOINT) for i in range(5)],
    )
    ports = {name: free_udp_port() for name in ("rendezvous", "agg-0", "agg-1", "agg-2", "parade")}
    capture = Capture(workdir / "capture.pcap", list(ports.values()))
    try:
        run_cluster(pki, workdir, keylog, ports)
        send_every_vector(pki, keylog, ports["parade"])
    finally:
        capture.stop()
    split = workdir / "split.pcap"
    done = subprocess.run(
        [sys.executable, str(WIRESHARK / "split_gso.py"), str(capture.path), str(split)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    fields = sorted(
        {
            f"cco.{_snake(cls.__name__)}.{name}"
            for cls in MESSAGE_CLASSES.values()
            for name, spec in cls.wire_fields()
            if not spec.optional
        }
    )
    command = ["tshark", "-n", "-r", str(split), "-o", f"tls.keylog_file:{keylog}"]
    command += ["-X", f"lua_script:{WIRESHARK / 'cco.lua'}", "-Y", "cco", "-T", "fields"]
    command += ["-E", "occurrence=a", "-E", "separator=/t", "-e", "cco.type"]
    for field in fields:
        command += ["-e", field]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Lua" not in done.stderr, done.stderr
    names = ["cco.type", *fields]
    yield [
        {name: value.split(",") for name, value in zip(names, line.split("\t"), strict=True) if value}
        for line in done.stdout.splitlines()
    ]


def test_every_message_type_is_decoded_with_every_field_it_always_has(
    decoded: list[dict[str, list[str]]],
) -> None:
    types = {int(code) for packet in decoded for code in packet.get("cco.type", [])}
    assert types == {int(code) for code in MESSAGE_CLASSES}
    shown = {name for packet in decoded for name in packet}
    for cls in MESSAGE_CLASSES.values():
        for name, spec in cls.wire_fields():
            if not spec.optional:
                assert f"cco.{_snake(cls.__name__)}.{name}" in shown, f"{cls.__name__}.{name} never shown"


def test_the_live_run_is_decoded_as_it_ran(decoded: list[dict[str, list[str]]]) -> None:
    """Fields carry the values the nodes sent: node ids in Hello, the group's id in
    every join, the refused endpoint's error code."""
    hello_ids = {v for packet in decoded for v in packet.get("cco.hello.node_id", [])}
    assert {"agg-0", "agg-1", "agg-2", "ep-0", "ep-3"} <= hello_ids
    groups = {v for packet in decoded for v in packet.get("cco.join_request.group_id", [])}
    assert GROUP in groups
    codes = {v for packet in decoded for v in packet.get("cco.join_reject.code", [])}
    assert "20" in codes  # BAD_CREDENTIAL
    kinds = {v for packet in decoded for v in packet.get("cco.broadcast_data.kind", [])}
    assert kinds == {"3"}  # BROADCAST
    bitmaps = {v for packet in decoded for v in packet.get("cco.join_accept.rank", [])}
    assert bitmaps >= {"0", "1", "2", "3"}
