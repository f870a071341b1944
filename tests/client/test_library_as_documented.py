"""The client library as a user meets it: the README's example, run as written, and what
a first script gets wrong (paths as str, ops by name, a GroupSpec's mistakes, which
rank a node id gets, use after close, an exception inside a ``with`` block).

The README's shell line and Python block run against a ``cco-node standalone`` the test
starts (on a free port: the block's ranks find it through CCO_RENDEZVOUS, as the README
says).  The other tests share one standalone job.
"""

from __future__ import annotations

import importlib.resources
import os
import pydoc
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cco
from cco.client import BlockingCommunicator, GroupSpec, NonFiniteError, default_rank, reduce_op
from cco.nodes.calls import OperationError
from cco.standalone import Job, Standalone, StandaloneSpec
from cco.transport import TransportConfig
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import ReduceOp

ROOT = Path(__file__).resolve().parents[2]


def library_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("### As a library") : text.index("### As nodes")]


def test_the_readme_library_example_runs_as_written(tmp_path: Path) -> None:
    section = library_section()
    shell = re.search(r"```sh\n(.*?)\n```", section, re.S)
    python = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert shell is not None and python is not None
    command = shell.group(1).split()
    assert command[:2] == ["cco-node", "standalone"], command
    (tmp_path / "example.py").write_text(python.group(1))
    port = _free_udp_port()
    services = subprocess.Popen(
        [sys.executable, "-m", "cco.cli", *command[1:], "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert services.stdout is not None
        first = services.stdout.readline()  # the first export line: the services are up
        assert first.startswith("export CCO_CONFIG="), first
        env = {**os.environ, "CCO_RENDEZVOUS": f"127.0.0.1:{port}"}
        done = subprocess.run(
            [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        services.terminate()
        services.wait(30)
    assert services.returncode in (0, 130, -15), services.returncode


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- what needs no group ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"group_id": b"short"}, "group_id"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 4}, "rank"),
        ({"credential": "text"}, "credential"),
        ({"labels": "rack-1"}, "labels"),
        ({"rendezvous": "localhost"}, "HOST:PORT"),
        ({"rendezvous_id": "Not An Id"}, "rendezvous_id"),
    ],
)
def test_a_group_spec_is_checked_when_it_is_made(fields: dict[str, object], named: str) -> None:
    arguments: dict[str, object] = {"group_id": bytes(16), "world_size": 4, **fields}
    with pytest.raises(ValueError, match=named):
        GroupSpec(**arguments)  # type: ignore[arg-type]


def test_a_group_spec_takes_its_rendezvous_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCO_RENDEZVOUS", "198.18.0.1:4433")
    assert GroupSpec(group_id=bytes(16), world_size=2).rendezvous == "198.18.0.1:4433"
    monkeypatch.delenv("CCO_RENDEZVOUS")
    assert GroupSpec(group_id=bytes(16), world_size=2).rendezvous == "127.0.0.1:4433"


def test_ranks_follow_the_node_id_then_rank() -> None:
    assert default_rank("ep-3", 4, {}) == 3
    assert default_rank("host-a.ep-12", 16, {"RANK": "5"}) == 12
    assert default_rank("ep-9", 4, {"RANK": "2"}) == 2  # 9 is no rank of 4: RANK's
    assert default_rank("worker", 4, {"RANK": "1"}) == 1
    assert default_rank("worker", 4, {}) is None  # the rendezvous gives one


def test_ops_are_accepted_by_name_in_any_case() -> None:
    assert reduce_op("sum") is ReduceOp.SUM
    assert reduce_op("BXOR") is ReduceOp.BXOR
    assert reduce_op(ReduceOp.AVG) is ReduceOp.AVG
    with pytest.raises(CcoError, match="sum, avg, min, max, band, bor, bxor"):
        reduce_op("product")


def test_paths_may_be_str_or_path(tmp_path: Path) -> None:
    cco.create_dev_pki(tmp_path, [("ep-0", cco.Role.ENDPOINT)])
    assert TransportConfig.for_node(str(tmp_path), "ep-0") == TransportConfig.for_node(tmp_path, "ep-0")


def test_public_names_are_listed_and_typed() -> None:
    assert set(cco.__all__) <= set(dir(cco))
    text = pydoc.render_doc(cco, renderer=pydoc.plaintext)
    for name in ("GroupSpec", "BlockingCommunicator", "Communicator", "OperationError"):
        assert f"class {name}" in text
    assert importlib.resources.files("cco").joinpath("py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["cco"]


# --- a group of two, in threads ------------------------------------------------------------


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    spec = StandaloneSpec(directory=tmp_path_factory.mktemp("job"), listen="127.0.0.1:0", endpoints=0)
    with Standalone(spec) as services:
        yield services.start()


_groups = iter(range(1, 1 << 30))


def pair(job: Job) -> list[BlockingCommunicator]:
    """Two members of a new group, joined at once from two threads; by rank."""
    number = next(_groups)
    spec = GroupSpec(group_id=number.to_bytes(16, "big"), world_size=2, rendezvous=job.rendezvous)
    names = [f"g{number}-{rank}" for rank in range(2)]
    cco.create_dev_pki(job.pki_dir, [(name, cco.Role.ENDPOINT) for name in names])
    joined: dict[int, BlockingCommunicator] = {}

    def join(name: str) -> None:
        comm = BlockingCommunicator.from_pki(spec, name, str(job.pki_dir), timeout=60)
        joined[comm.rank] = comm

    threads = [threading.Thread(target=join, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert sorted(joined) == [0, 1], "both members joined, ranks from their node ids"
    return [joined[0], joined[1]]


def both(calls: list[object]) -> list[object]:
    """Run one call per rank at once (each a no-argument function); their results."""
    results: dict[int, object] = {}

    def run(index: int, call: object) -> None:
        try:
            results[index] = call()  # type: ignore[operator]
        except Exception as exc:  # handed back to the test
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == len(calls), "a call did not return"
    return [results[i] for i in range(len(calls))]


def test_ops_by_name_out_arrays_and_nonfinite_modes(job: Job) -> None:
    comms = pair(job)
    try:
        inputs = [np.arange(1000, dtype=np.int32) * (r + 1) for r in range(2)]
        outs = [np.empty(1000, dtype=np.int32) for _ in range(2)]
        results = both(
            [
                lambda c=c, x=x, o=o: c.all_reduce(x, "sum", out=o)
                for c, x, o in zip(comms, inputs, outs, strict=True)
            ]
        )
        for result, out in zip(results, outs, strict=True):
            assert isinstance(result, np.ndarray) and np.shares_memory(result, out)
            assert np.array_equal(out, np.arange(1000, dtype=np.int32) * 3)
        floats = [np.ones(300, dtype=np.float32) for _ in range(2)]
        floats[1][7] = np.inf
        propagated = both(
            [
                lambda c=c, x=x: c.all_reduce(x, nonfinite="propagate")
                for c, x in zip(comms, floats, strict=True)
            ]
        )
        assert all(np.isnan(r).all() for r in propagated)  # type: ignore[call-overload]
        reported = both(
            [lambda c=c, x=x: c.all_reduce(x, nonfinite="report") for c, x in zip(comms, floats, strict=True)]
        )
        for error in reported:
            assert isinstance(error, NonFiniteError) and error.ranks == frozenset({1})
        finite = both(
            [
                lambda c=c: c.all_reduce(np.ones(300, dtype=np.float32), "avg", nonfinite="report")
                for c in comms
            ]
        )
        assert all(np.array_equal(r, np.ones(300, dtype=np.float32)) for r in finite)  # type: ignore[arg-type]
    finally:
        both([lambda c=c: c.close() for c in comms])


def test_a_closed_communicator_raises_at_once_instead_of_hanging(job: Job) -> None:
    comms = pair(job)
    both([lambda c=c: c.close() for c in comms])
    for comm in comms:
        with pytest.raises(CcoError) as info:
            comm.all_reduce(np.ones(4, dtype=np.int32))
        assert info.value.code is ErrorCode.ABORTED
        with pytest.raises(CcoError):
            comm.barrier()
        comm.close()  # closing again does nothing


def test_a_block_that_raises_leaves_at_once_and_the_other_rank_learns_who_left(job: Job) -> None:
    """The rank whose ``with`` block raised does not wait at the close barrier: the
    other rank's next collective fails naming it (PEER_LOST), not with a misleading
    OPERATION_MISMATCH against a barrier it never called."""
    leaver, stayer = pair(job)
    left = threading.Event()

    def leave() -> None:
        with pytest.raises(RuntimeError), leaver:
            raise RuntimeError("the training step failed")
        left.set()

    def stay() -> object:
        assert left.wait(60), "the raising block did not leave"
        try:
            return stayer.all_reduce(np.ones(8, dtype=np.int64))
        except OperationError as error:
            return error

    outcome = both([leave, stay])[1]
    try:
        assert isinstance(outcome, OperationError), outcome
        assert outcome.code is ErrorCode.PEER_LOST
        assert outcome.missing_ranks == frozenset({0})
        with pytest.raises(CcoError, match="closed"):  # the raising block closed it
            leaver.barrier()
    finally:
        stayer.close(linger=False)


def test_a_call_blocked_when_another_thread_closes_is_released(job: Job) -> None:
    first, second = pair(job)
    pending = first.start_all_reduce(np.ones(16, dtype=np.int32))  # the other rank never calls it
    first.close(linger=False)
    with pytest.raises(CcoError) as info:
        pending.result(timeout=60)
    assert info.value.code is ErrorCode.ABORTED
    second.close(linger=False)
