"""A member loads the compiled loops before it joins, so that its first collective on a
fresh process does not hold the event loop, and with it the heartbeats, while numba is
imported and the loops are compiled (or loaded from numba's cache).

The measure is the loop's longest stall in the loop thread's own CPU seconds (a probe
on the loop, ``first_collective_rank.py``), not wall time, so a busy host changes it
little; beside it, exact facts: numba was not in the process before the join, was
after it, and the session loaded no loop of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cco
from cco.standalone import Job, Standalone, StandaloneSpec
from cco.wire import kernels

RANKS = Path(__file__).resolve().parent / "first_collective_rank.py"
STALL_BOUND = 0.2
"""CPU seconds: well under the heartbeat interval (1 s) and under what importing numba
and loading its loops holds a thread for (the contrast in the test measures it); a
float32 all-reduce's own steps on the loop take milliseconds."""

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed (pip install 'cco[fast]')"
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    spec = StandaloneSpec(directory=tmp_path_factory.mktemp("job"), listen="127.0.0.1:0", endpoints=0)
    with Standalone(spec) as services:
        started = services.start()
        cco.create_dev_pki(started.pki_dir, [(f"fc-{rank}", cco.Role.ENDPOINT) for rank in range(2)])
        yield started


def first_collectives(job: Job, *flags: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != kernels.KERNELS_ENV}
    environ.update(CCO_PKI_DIR=str(job.pki_dir), CCO_RENDEZVOUS=job.rendezvous)
    done = subprocess.run(
        [sys.executable, str(RANKS), *flags], env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_first_collective_of_a_fresh_process_does_not_stall_its_loop(job: Job) -> None:
    seen = first_collectives(job)
    assert not seen["numba_before"], "importing cco loads no numba"
    assert seen["numba_at_join"], "the join loaded the compiled loops"
    assert seen["loaded_in_session"] == [], "every loop the collectives ran was loaded before the join"
    assert seen["stall"] < STALL_BOUND, f"the loop ran {seen['stall']:.3f} CPU s without turning"
    assert seen["join_stall"] < STALL_BOUND, "loading the loops kept off the event loop"
    # The contrast, so that the probe is known to see what it looks for: joined without
    # the preload, the first large chunk loads numba and its loops on the loop.
    unloaded = first_collectives(job, "--no-preload")
    assert not unloaded["numba_at_join"] and unloaded["loaded_in_session"]
    assert unloaded["stall"] > 3 * seen["stall"], (unloaded["stall"], seen["stall"])
