"""A star of network namespaces on one machine: the testbed for bandwidth-bound runs.

One *hub* namespace routes between N *endpoint* namespaces, one veth link each, and
hosts whatever must sit on the path (the rendezvous and the aggregator), so every byte
an endpoint sends or receives crosses its own shaped link, and endpoint-to-endpoint
traffic (a ring all-reduce) crosses two.  Each direction of each link is shaped with a
``tbf`` qdisc to the same rate: the endpoint side shapes the way up, the hub side the
way down.

Addresses come from 198.18.0.0/15 (set aside for benchmarking) only::

    hub      lo    198.18.0.1/32        services listen here (HUB_ADDRESS)
    hub      ep<i> 198.18.<i+1>.1/24    gateway of endpoint i
    ep<i>    eth0  198.18.<i+1>.2/24    default route via 198.18.<i+1>.1

Names: every namespace of one star is called ``<base>-<pid>-hub`` or
``<base>-<pid>-ep<i>``, where ``pid`` is the process that built it.  Before building,
:class:`Star` removes every namespace of the same ``base`` whose owner process is gone
(a crashed run), first killing what still runs inside it, so a crash never leaves the
next run a mess, and two live runs never touch each other.  A star is a context
manager; it is also torn down at interpreter exit and on SIGTERM/SIGHUP.

Sizing of ``tbf`` (see :func:`tbf_sizes`):

* ``burst`` (the bucket) must hold at least one whole frame, or a frame larger than
  the bucket can never be sent and is dropped: for jumbo frames that means 9014 bytes,
  far above the few KB people usually give.  We take two frames or 2 ms at the rate,
  whichever is larger: small enough that the link never runs measurably above its
  rate (2 ms against runs of seconds), large enough for back-to-back jumbo frames.
* ``limit`` (the queue in bytes) decides when tbf drops.  A queue of a few frames
  drops whole bursts from a sender that writes a congestion window at once (as a
  Python QUIC stack does), and every drop costs loss recovery and a halved window; a
  huge queue only adds delay.  We take ``queue_ms`` (default 100 ms) at the rate, but
  never fewer than 32 full frames.  At 40 Mbit/s that is 500 KB (55 jumbo or 330
  standard frames) and at most 100 ms of queueing delay.

A star may also be left unshaped (``rate_mbit=None``: no qdisc but the default, the
links as fast as the CPU makes them), which is where the nodes' CPU per byte shows.

**GRO.**  A veth hands each frame up the receiver's stack on its own unless GRO is
on for it (``ethtool -K DEV gro on``; off by default), as a NIC without receive
offload does; with GRO on, a sender's consecutive UDP datagrams of one size reach a
socket that asked for them (``UDP_GRO``) as one buffer, as with real NICs, which
coalesce by default.  ``StarSpec.gro`` sets it on both ends of every link (None:
the kernel's default).  What veth GRO changes is the datagrams a sender hands over
one by one: a GSO send (``UDP_SEGMENT``, as the nodes send runs of equal datagrams)
crosses an unshaped veth as one super-packet and reaches a ``UDP_GRO`` socket whole,
GRO on or off, as on loopback; a tbf qdisc splits it into frames before the link
where its bucket is smaller than the super-packet (slow rates, see ``tbf_sizes``).

Requires root, ``ip`` and ``tc`` (iproute2), ``ethtool`` to set GRO, and a kernel
with veth and tbf; :func:`unavailable_reason` says in one line why a star cannot be
built here.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cputrace import CpuTrace

from cco.localcluster import unwind_on_signals

HUB_ADDRESS = "198.18.0.1"
"""Where services in the hub listen; every endpoint reaches it over its own link."""

ETHERNET_HEADER = 14
"""Bytes tbf counts on top of the IP packet on a veth link."""

IP_UDP_HEADERS = 48
"""IPv6 (40) and UDP (8) headers, which also covers IPv4 (20 + 8)."""

DEFAULT_BASE = "ccostar"


def quic_datagram_size(mtu: int) -> int:
    """The QUIC ``max_datagram_size`` for a link MTU: 1500 -> 1452, 9000 -> 8952.

    QUIC's ``max_datagram_size`` is the UDP payload; MTU minus the IPv6 and UDP
    headers fits either IP version, the same choice as the usual 1452 for 1500.
    """
    return mtu - IP_UDP_HEADERS


def tbf_sizes(rate_bit: float, mtu: int, queue_ms: float = 100.0) -> tuple[int, int]:
    """``(burst, limit)`` in bytes for a tbf at ``rate_bit`` bit/s on a link of ``mtu``.

    See the module docstring for why: the bucket holds two frames or 2 ms at the
    rate; the queue holds ``queue_ms`` at the rate, and never fewer than 32 frames.
    """
    if rate_bit <= 0 or mtu < 576 or queue_ms <= 0:
        raise ValueError(f"bad shaping: rate {rate_bit} bit/s, mtu {mtu}, queue {queue_ms} ms")
    frame = mtu + ETHERNET_HEADER
    rate_bytes = rate_bit / 8
    burst = max(2 * frame, int(rate_bytes * 0.002))
    limit = max(32 * frame, int(rate_bytes * queue_ms / 1000), burst)
    return burst, limit


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up; the message says which command."""


def _run(
    argv: Sequence[str], check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, cwd=cwd)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why a namespace star cannot be built here, in one line; None if it can.

    Checks the platform, root, the ``ip`` and ``tc`` tools, and then really creates
    and removes a probe namespace with a tbf qdisc, since containers often forbid that
    even to root.
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in CI)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{DEFAULT_BASE}-{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "-n", probe, "link", "set", "lo", "up"])
        _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf",
              "rate", "1mbit", "burst", "20000", "limit", "100000"])  # fmt: skip
    except NetnsError as exc:
        return f"cannot shape a link with tbf: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(base: str = DEFAULT_BASE) -> list[str]:
    """Delete the namespaces of ``base`` whose owner process is gone; returns their names.

    Processes still running inside such a namespace were started by that crashed run
    and are killed first, so the namespace really goes away.
    """
    live = {ns for star in _LIVE for ns in (star.hub_ns, *star.endpoint_ns)}
    removed = []
    for name in _namespaces():
        owner = name[len(base) + 1 :].split("-", 1)[0] if name.startswith(base + "-") else ""
        if not owner.isdigit() or name in live:
            continue
        if int(owner) != os.getpid() and _alive(int(owner)):
            continue
        _kill_inside(name)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def _kill_inside(namespace: str) -> None:
    pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@dataclass(frozen=True, slots=True, kw_only=True)
class StarSpec:
    """Shape of a star: endpoints, link MTU, rate of each direction, queue depth."""

    endpoints: int
    rate_mbit: float | None = 40.0
    """Rate of each direction of each link; None: no shaping."""
    mtu: int = 9000
    queue_ms: float = 100.0
    gro: bool | None = None
    """GRO on (True) or off (False) on both ends of every link; None: the kernel's default."""
    base: str = DEFAULT_BASE

    def __post_init__(self) -> None:
        if not 1 <= self.endpoints <= 254:
            raise ValueError(f"endpoints must be 1..254, got {self.endpoints}")
        if not 576 <= self.mtu <= 65535:
            raise ValueError(f"mtu must be 576..65535, got {self.mtu}")
        if not self.base.isalnum():
            raise ValueError(f"base must be letters and digits, got {self.base!r}")
        if self.rate_mbit is not None:
            tbf_sizes(self.rate_mbit * 1e6, self.mtu, self.queue_ms)  # validates the rest
        if self.gro is not None and shutil.which("ethtool") is None:
            raise ValueError("setting veth GRO needs ethtool (apt-get install ethtool)")


@dataclass
class Star:
    """A built star; use as ``with Star(spec) as star:``.

    ``star.endpoint_ns[i]`` and ``star.hub_ns`` name the namespaces,
    ``star.endpoint_address(i)`` gives endpoint i's address, :meth:`popen` starts a
    process inside a namespace (stopped at tear-down if still running).
    """

    spec: StarSpec
    hub_ns: str = field(init=False)
    endpoint_ns: list[str] = field(init=False)
    _processes: list[subprocess.Popen[Any]] = field(init=False, default_factory=list)
    _built: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        prefix = f"{self.spec.base}-{os.getpid()}"
        self.hub_ns = f"{prefix}-hub"
        self.endpoint_ns = [f"{prefix}-ep{i}" for i in range(self.spec.endpoints)]

    # --- building and tearing down ---------------------------------------------------

    def up(self) -> Star:
        """Remove leftovers of crashed runs, then build namespaces, links, routes, qdiscs."""
        remove_leftovers(self.spec.base)
        _LIVE.append(self)
        _install_cleanup()
        self._built = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        spec = self.spec
        hub = self.hub_ns
        _run(["ip", "netns", "add", hub])
        _run(["ip", "-n", hub, "link", "set", "lo", "up"])
        _run(["ip", "-n", hub, "addr", "add", f"{HUB_ADDRESS}/32", "dev", "lo"])
        _run(["ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        shape: list[str] = []
        if spec.rate_mbit is not None:
            burst, limit = tbf_sizes(spec.rate_mbit * 1e6, spec.mtu, spec.queue_ms)
            shape = [
                "tbf",
                "rate",
                f"{int(spec.rate_mbit * 1e6)}bit",
                "burst",
                str(burst),
                "limit",
                str(limit),
            ]
        for i, ns in enumerate(self.endpoint_ns):
            hub_if, hub_ip, ep_ip = f"ep{i}", self.gateway_address(i), self.endpoint_address(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", "name", "eth0", "netns", ns, "mtu", str(spec.mtu), "type", "veth",
                  "peer", "name", hub_if, "netns", hub, "mtu", str(spec.mtu)])  # fmt: skip
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ep_ip}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", hub, "addr", "add", f"{hub_ip}/24", "dev", hub_if])
            _run(["ip", "-n", hub, "link", "set", hub_if, "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", hub_ip])
            if shape:
                _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *shape])  # the way up
                _run(["tc", "-n", hub, "qdisc", "add", "dev", hub_if, "root", *shape])  # the way down
            if spec.gro is not None:
                self.set_gro(spec.gro, i)

    def set_gro(self, on: bool, index: int | None = None) -> None:
        """GRO on or off on both ends of endpoint ``index``'s link (None: every link)."""
        state = "on" if on else "off"
        indices = range(self.spec.endpoints) if index is None else [index]
        for i in indices:
            for ns, dev in ((self.endpoint_ns[i], "eth0"), (self.hub_ns, f"ep{i}")):
                _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "gro", state])

    def gro_state(self, index: int) -> tuple[bool, bool]:
        """Whether GRO is on at (the endpoint's, the hub's) end of endpoint ``index``'s link."""
        ends = ((self.endpoint_ns[index], "eth0"), (self.hub_ns, f"ep{index}"))
        states = []
        for ns, dev in ends:
            out = _run(["ip", "netns", "exec", ns, "ethtool", "-k", dev]).stdout
            line = next(x for x in out.splitlines() if x.startswith("generic-receive-offload:"))
            states.append(line.split(":", 1)[1].split()[0] == "on")
        return states[0], states[1]

    def down(self) -> None:
        """Stop processes started in the star, delete its namespaces (and so its links)."""
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        if self._built:
            for ns in [*self.endpoint_ns, self.hub_ns]:
                _kill_inside(ns)
                _run(["ip", "netns", "del", ns], check=False)
            self._built = False
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)

    def __enter__(self) -> Star:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- using it --------------------------------------------------------------------

    @staticmethod
    def endpoint_address(index: int) -> str:
        return f"198.18.{index + 1}.2"

    @staticmethod
    def gateway_address(index: int) -> str:
        return f"198.18.{index + 1}.1"

    def exec_prefix(self, namespace: str) -> list[str]:
        """``ip netns exec <namespace>``: put it before a command line."""
        return ["ip", "netns", "exec", namespace]

    def popen(self, namespace: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``namespace``; it is stopped at tear-down if still running."""
        process: subprocess.Popen[Any] = subprocess.Popen([*self.exec_prefix(namespace), *argv], **kwargs)
        self._processes.append(process)
        return process

    def link_stats(self) -> list[dict[str, int]]:
        """Per endpoint: bytes sent, packets dropped and overlimits of tbf, up and down."""
        stats = []
        for i, ns in enumerate(self.endpoint_ns):
            up = _qdisc_stats(ns, "eth0")
            down = _qdisc_stats(self.hub_ns, f"ep{i}")
            stats.append(
                {
                    "up_bytes": up.get("bytes", 0),
                    "up_drops": up.get("drops", 0),
                    "up_overlimits": up.get("overlimits", 0),
                    "down_bytes": down.get("bytes", 0),
                    "down_drops": down.get("drops", 0),
                    "down_overlimits": down.get("overlimits", 0),
                }
            )
        return stats


def _qdisc_stats(namespace: str, device: str) -> dict[str, int]:
    out = _run(["tc", "-n", namespace, "-s", "-j", "qdisc", "show", "dev", device]).stdout
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("kind") == "tbf":
            return {k: int(v) for k, v in qdisc.items() if k in ("bytes", "drops", "overlimits")}
    return {}


# --- cleanup at exit and on signals ------------------------------------------------------

_LIVE: list[Star] = []
_CLEANUP_INSTALLED = False


def _tear_down_all() -> None:
    for star in list(_LIVE):
        star.down()


def _install_cleanup() -> None:
    """atexit always; SIGTERM and SIGHUP unwind (so `with Star(...)` blocks and atexit
    both run) where nobody else handles them."""
    global _CLEANUP_INSTALLED
    if _CLEANUP_INSTALLED:
        return
    _CLEANUP_INSTALLED = True
    atexit.register(_tear_down_all)
    unwind_on_signals()


# --- a CCO cluster on a star ---------------------------------------------------------------

RENDEZVOUS_PORT = 4433
AGGREGATOR_PORT = 4500
RELAY_PORT = 4600
RELAY = Path(__file__).resolve().parent / "relay.py"
UNTAGGED = Path(__file__).resolve().parent / "untagged.py"


@dataclass(frozen=True, slots=True, kw_only=True)
class CcoSettings:
    """Node options for a cluster; None leaves an option at the node's own default."""

    max_datagram_size: int | None = None
    chunk_elements: int | None = None
    scaled_chunk_elements: int | None = None
    """The group's limit for a block-scaled operation's agreed chunk size (the
    rendezvous's ``--scaled-chunk-elements``)."""
    window: int | None = None
    operation_timeout_ms: int | None = None
    heartbeat_ms: int | None = None
    log_level: str = "info"
    wan_delay_ms: float = 0.0
    """One-way delay added each way between endpoints and aggregator (``relay.py``)."""
    wan_loss: float = 0.0
    """Loss probability each way between endpoints and aggregator (``relay.py``)."""
    untagged: bool = False
    """Endpoints run through ``untagged.py``: every MAC tag zero (the "tags off" side)."""
    quic_backend: str | None = None
    """Every node's QUIC implementation (``--quic-backend``); None: the node default."""
    dtype: str | None = None
    """The endpoints' workload element type (``--dtype``); None: float32, its default."""
    busy_poll_us: int | None = None
    """Every node's ``--busy-poll-us``; None: each role's default (polling in the
    aggregator and the endpoints, none in the rendezvous)."""
    nodes_from: Path | None = None
    """A source tree whose ``cco`` the nodes import (on their PYTHONPATH) instead of
    the harness's: an A/B of two commits with one harness."""
    launcher: Path | None = None
    """A script every node runs through instead of ``python -m cco.cli`` (it ends in
    ``cco.cli.main``), such as ``bench_round_trace.py``'s stamps; ``untagged`` still
    decides the endpoints'."""

    @property
    def wan(self) -> bool:
        return self.wan_delay_ms > 0 or self.wan_loss > 0

    def rendezvous_args(self) -> list[str]:
        args = _flag("chunk-elements", self.chunk_elements) + _flag("window", self.window)
        args += _flag("scaled-chunk-elements", self.scaled_chunk_elements)
        args += _flag("heartbeat-ms", self.heartbeat_ms)
        return args + _flag("operation-timeout-ms", self.operation_timeout_ms)

    def common_args(self) -> list[str]:
        args = [*_flag("max-datagram-size", self.max_datagram_size), "--log-level", self.log_level]
        args += _flag("busy-poll-us", self.busy_poll_us)
        return args + (["--quic-backend", self.quic_backend] if self.quic_backend else [])


def _flag(name: str, value: int | None) -> list[str]:
    return [] if value is None else [f"--{name}", str(value)]


def last_call_to_last_result(started: list[float], seconds: list[float]) -> float:
    """From the last call to the last result of one collective, given when each rank
    called (one clock for all) and how long it took."""
    return max(t + s for t, s in zip(started, seconds, strict=True)) - max(started)


@dataclass(frozen=True, slots=True)
class EndpointRun:
    """What the endpoints of one run reported: per rank, the workload's result file."""

    reports: list[dict[str, Any]]
    wall_seconds: float
    cpu_seconds: list[float]
    """Each endpoint process's user + system CPU time (from wait4), by rank."""
    trace: CpuTrace | None = None
    """The CPU of the aggregator and the endpoints over the run, for :meth:`rounds_cpu`."""
    aggregator_pid: int = 0
    endpoint_pids: tuple[int, ...] = ()

    def rounds_cpu(self, first: int) -> tuple[float, list[float]] | None:
        """CPU seconds of the aggregator and of each endpoint (by rank) from the first
        rank's call of round ``first`` to the last rank's result of the last round:
        the warm datapath, without start-up, joining and the rounds before; None
        where the trace does not cover it (it takes a few seconds, see cputrace.py).

        An endpoint's figure leaves out what its workload spent between those calls
        hashing each result and drawing the next input (``workload_cpu_seconds`` of
        every round but the last, measured on the workload's thread): that is the
        benchmark's own work, which Gloo's side does not do, not the datapath's."""
        if self.trace is None or first >= len(self.reports[0]["rounds"]):
            return None
        start = min(r["rounds"][first]["started"] for r in self.reports)
        end = max(r["rounds"][-1]["started"] + r["rounds"][-1]["seconds"] for r in self.reports)
        aggregator = self.trace.between(self.aggregator_pid, start, end)
        endpoints = []
        for pid, report in zip(self.endpoint_pids, self.reports, strict=True):
            cpu = self.trace.between(pid, start, end)
            if cpu is None:
                return None
            workload = sum(r.get("workload_cpu_seconds", 0.0) for r in report["rounds"][first:-1])
            endpoints.append(cpu - workload)
        if aggregator is None:
            return None
        return aggregator, endpoints

    def round_seconds(self) -> list[float]:
        """Each round's time on the slowest rank."""
        rounds = len(self.reports[0]["rounds"])
        return [max(r["rounds"][i]["seconds"] for r in self.reports) for i in range(rounds)]

    def chunk_elements(self) -> list[list[int | None]]:
        """Each round's chunk size, by rank: what the ranks of a float sum agreed (the
        same on every rank), or None where the endpoint did not report it."""
        rounds = len(self.reports[0]["rounds"])
        return [[r["rounds"][i].get("chunk_elements") for r in self.reports] for i in range(rounds)]

    def from_last_call(self) -> list[float]:
        """Each round's time from the last rank's call to the last rank's result.

        A rank that calls early waits for the others, and its own time counts that
        wait; on a host whose cores the ranks share, the last rank to get its result
        of one round is also the last to call the next.  This leaves the wait out:
        what the collective takes once every rank has called (the ranks' ``started``
        share one clock on one host)."""
        rounds = len(self.reports[0]["rounds"])
        return [
            last_call_to_last_result(
                [r["rounds"][i]["started"] for r in self.reports],
                [r["rounds"][i]["seconds"] for r in self.reports],
            )
            for i in range(rounds)
        ]

    def bit_identical(self) -> bool:
        rounds = len(self.reports[0]["rounds"])
        return all(len({r["rounds"][i]["sha256"] for r in self.reports}) == 1 for i in range(rounds))


class CcoCluster:
    """Real ``cco-node`` processes on a star (or on loopback when ``star`` is None).

    The rendezvous and one aggregator run in the hub, listening on
    :data:`HUB_ADDRESS`; endpoint i runs in namespace i and reaches them over its own
    shaped link.  Credentials come from ``cco-node certs``.  :meth:`run` starts a fresh
    group of endpoints (a new group id each time) and returns what they reported;
    :meth:`close` stops the hub's services and returns the aggregator's peak RSS and
    CPU seconds, read from /proc just before it is told to stop.
    """

    def __init__(self, star: Star | None, workdir: Path, endpoints: int, settings: CcoSettings) -> None:
        self.star = star
        self.workdir = workdir.resolve()  # the nodes run in it: every path they get is absolute
        self.endpoints = endpoints
        self.settings = settings
        self.host = HUB_ADDRESS if star is not None else "127.0.0.1"
        self.pki = self.workdir / "pki"
        self._services: list[tuple[str, subprocess.Popen[Any]]] = []
        self._runs = 0
        # a harness stopped by SIGTERM or SIGHUP (a timeout, a cancelled job) then
        # unwinds through `with CcoCluster(...)` and stops its nodes, on loopback too
        _install_cleanup()

    def _spawn(
        self, namespace: str | None, name: str, args: list[str], program: list[str] | None = None
    ) -> subprocess.Popen[Any]:
        default = [str(self.settings.launcher)] if self.settings.launcher else ["-m", "cco.cli"]
        argv = [*(program or [sys.executable, *default]), *args]
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - the child owns it
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.settings.nodes_from is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.settings.nodes_from.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        # Not the caller's directory: `python -m` puts the working directory first on
        # sys.path, so a node started from a checkout would import that checkout's cco
        # instead of the one PYTHONPATH or the installation names (an A/B of two
        # versions would then measure one twice).
        kwargs: dict[str, Any] = {"stdout": log, "stderr": subprocess.STDOUT, "env": env, "cwd": self.workdir}
        try:
            if self.star is not None and namespace is not None:
                return self.star.popen(namespace, argv, **kwargs)
            return subprocess.Popen(argv, **kwargs)
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tail(self, name: str, width: int = 240) -> str:
        """The node's own one-line error if it printed one, else its last log line; cut to ``width``."""
        lines = self.log(name).strip().splitlines() or ["(no output)"]
        errors = [line for line in lines if line.startswith("cco-node:")]
        line = (errors or lines)[-1]
        return line if len(line) <= width else line[: width - 3] + "..."

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.pki, ignore_errors=True)  # a new CA per cluster: reusing a work dir is no mistake
        nodes = ["rendezvous:rendezvous", "agg-0:aggregator"]
        _run([sys.executable, "-m", "cco.cli", "certs", "--dir", str(self.pki), *nodes], cwd=self.workdir)
        hub = self.star.hub_ns if self.star is not None else None
        common = ["--pki-dir", str(self.pki), *self.settings.common_args()]
        rendezvous = f"{self.host}:{RENDEZVOUS_PORT if hub else _free_port()}"
        listen = f"{self.host}:{AGGREGATOR_PORT if hub else _free_port()}"
        rendezvous_args = ["--role", "rendezvous", "--node-id", "rendezvous", "--listen", rendezvous]
        rendezvous_args += ["--store", ":memory:"]  # nothing kept from an earlier run
        self._services.append(
            (
                "rendezvous",
                self._spawn(hub, "rendezvous", [*rendezvous_args, *common, *self.settings.rendezvous_args()]),
            )
        )
        self._wait_listening("rendezvous", timeout)
        self.rendezvous = rendezvous
        aggregator_args = ["--role", "aggregator", "--node-id", "agg-0", "--listen", listen]
        # every endpoint a child of the one aggregator (the protocol's least fan-in is 2)
        fan_in = max(2, self.endpoints)
        aggregator_args += ["--rendezvous", rendezvous, "--max-fan-in", str(fan_in)]
        if self.settings.wan:
            # Endpoints are told the relay's address; the relay forwards to the aggregator.
            relayed = f"{self.host}:{RELAY_PORT if hub else _free_port()}"
            relay_args = [
                "--listen",
                relayed,
                "--target",
                listen,
                "--delay-ms",
                str(self.settings.wan_delay_ms),
            ]
            relay_args += ["--loss", str(self.settings.wan_loss)]
            self._services.append(
                ("relay", self._spawn(hub, "relay", relay_args, [sys.executable, str(RELAY)]))
            )
            self._wait_listening("relay", timeout, "relaying")
            aggregator_args += ["--advertise", relayed]
        self._services.append(("agg-0", self._spawn(hub, "agg-0", [*aggregator_args, *common])))
        self._wait_listening("agg-0", timeout)

    def _wait_listening(self, name: str, timeout: float, needle: str = "listening") -> None:
        process = dict(self._services)[name]
        deadline = time.monotonic() + timeout
        while needle not in self.log(name):
            if process.poll() is not None:
                raise NetnsError(f"{name} exited with {process.returncode}: {self.tail(name)}")
            if time.monotonic() > deadline:
                raise NetnsError(f"{name} did not start listening within {timeout} s: {self.tail(name)}")
            time.sleep(0.05)

    def run(self, elements: int, rounds: int, timeout: float) -> EndpointRun:
        """One group of endpoints doing ``rounds`` verified all-reduces (float32 unless
        the settings name another dtype).

        Raises NetnsError naming every endpoint that failed or did not finish in
        ``timeout`` seconds, with the end of its log.
        """
        self._runs += 1
        group_id = os.urandom(16).hex()
        # Fresh node ids per run: an endpoint that exits without closing its rendezvous
        # connection keeps its id "already connected" there for up to 3 heartbeats.
        node_ids = [f"r{self._runs}-ep-{i}" for i in range(self.endpoints)]
        certs = ["certs", "--dir", str(self.pki), *(f"{node}:endpoint" for node in node_ids)]
        _run([sys.executable, "-m", "cco.cli", *certs], cwd=self.workdir)
        started = time.perf_counter()
        processes = []
        trace = CpuTrace()
        trace.follow(self.aggregator_pid)
        for i in range(self.endpoints):
            name = f"run{self._runs}-ep-{i}"
            args = ["--role", "endpoint", "--node-id", node_ids[i], "--pki-dir", str(self.pki)]
            args += ["--rendezvous", self.rendezvous, "--group-id", group_id, "--rank", str(i)]
            args += ["--world-size", str(self.endpoints), "--workload", "allreduce"]
            args += ["--rounds", str(rounds), "--elements", str(elements)]
            args += ["--dtype", self.settings.dtype] if self.settings.dtype else []
            args += ["--results", str(self.workdir / f"{name}.json"), *self.settings.common_args()]
            namespace = self.star.endpoint_ns[i] if self.star is not None else None
            program = [sys.executable, str(UNTAGGED)] if self.settings.untagged else None
            processes.append((name, self._spawn(namespace, name, args, program)))
            trace.follow(processes[-1][1].pid)  # `ip netns exec` execs: the node's own pid
        deadline = started + timeout
        failed = []
        cpu = []
        try:
            for name, process in processes:
                try:
                    code, seconds = _wait_cpu(process, deadline - time.perf_counter())
                    cpu.append(seconds)
                except subprocess.TimeoutExpired:
                    failed.append(f"{name} did not finish within {timeout:.0f} s: {self.tail(name)}")
                    continue
                if code != 0:
                    failed.append(f"{name} exited with {code}: {self.tail(name)}")
            wall = time.perf_counter() - started
        finally:  # also when the harness is stopped meanwhile: no endpoint outlives it
            trace.stop()
            for _, process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if failed:
            raise NetnsError("; ".join(failed))
        reports = [json.loads((self.workdir / f"{name}.json").read_text()) for name, _ in processes]
        return EndpointRun(
            reports=reports,
            wall_seconds=wall,
            cpu_seconds=cpu,
            trace=trace,
            aggregator_pid=self.aggregator_pid,
            endpoint_pids=tuple(process.pid for _, process in processes),
        )

    @property
    def aggregator_pid(self) -> int:
        """The aggregator's process id (its launcher's, which may have exec'd another program)."""
        return self.service_pids()["agg-0"]

    def service_pids(self) -> dict[str, int]:
        """The running services' process ids (launchers' included), by name."""
        return {name: process.pid for name, process in self._services}

    def aggregator_usage(self) -> dict[str, float]:
        """The aggregator's peak RSS (bytes) and CPU seconds so far, from /proc."""
        return _proc_usage(self.aggregator_pid)

    def close(self) -> dict[str, float]:
        """Stop the services (SIGTERM, then SIGKILL after 5 s); the aggregator's usage."""
        usage: dict[str, float] = {}
        with contextlib.suppress(OSError, KeyError, ValueError):
            usage = self.aggregator_usage()
        for _, process in self._services:
            if process.poll() is None:
                process.terminate()
        for _, process in self._services:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._services.clear()
        return usage

    def __enter__(self) -> CcoCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_cpu(process: subprocess.Popen[Any], timeout: float) -> tuple[int, float]:
    """Reap ``process`` within ``timeout`` s: (exit code, CPU seconds it used).

    ``ip netns exec`` execs the command, so the child is the node itself and wait4's
    resource usage is the node's own.
    """
    deadline = time.monotonic() + max(0.1, timeout)
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        time.sleep(0.05)


def _proc_usage(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = next((line for line in status.splitlines() if line.startswith("VmHWM:")), None)
    if hwm is None:  # a zombie: the process has exited and its memory is gone
        raise ValueError(f"process {pid} has exited")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "peak_rss_bytes": float(int(hwm.split()[1]) * 1024),
        "cpu_seconds": (int(fields[11]) + int(fields[12])) / ticks,  # utime, stime
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
