"""The "cco" torch.distributed backend, run as ranks of real processes.

One standalone job (a rendezvous and an aggregator on loopback) serves the module.
Ranks join it through ``init_process_group("cco")`` with torchrun's variables and
compare what they get with a Gloo group on the same inputs (see ``torch_worker.py``
for each check and its bound).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'cco[torch]')")

from torch_ranks import checked, failures, free_tcp_port, run_ranks, standalone

from cco.standalone import Job


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    with standalone(tmp_path_factory.mktemp("job")) as running:
        yield running


def test_every_collective_matches_gloo_on_four_ranks(job: Job, tmp_path: Path) -> None:
    reports = run_ranks(job, tmp_path, "ops", 4)
    assert not failures(reports), "\n".join(failures(reports))
    names = checked(reports)
    for expected in (
        "all_reduce SUM torch.bfloat16 x3000",
        "all_reduce AVG at width 8 (the hook's)",
        "reduce_scatter (tensor) SUM torch.float16",
        "all_gather torch.bool",
        "coalesced and older forms of all_reduce, all_gather and reduce_scatter",
        "async_op=True: Work, future and barrier",
        "SUM with inf on one rank: NaN on every rank",
        "a failed in-place all_reduce leaves its input",
        "all_to_all refused",
    ):
        assert expected in names


@pytest.mark.parametrize("init_method", ["tcp://", "file://"])
def test_init_process_group_with_two_ranks_and_other_init_methods(
    job: Job, tmp_path: Path, init_method: str
) -> None:
    """env:// is the four-rank test's; these also check pg_options and a new_group."""
    if init_method == "tcp://":
        args = ["--init-method", f"tcp://127.0.0.1:{free_tcp_port()}"]
    else:
        args = ["--init-method", f"file://{tmp_path / 'store'}", "--width", "16"]
    reports = run_ranks(job, tmp_path, "init", 2, *args)
    assert not failures(reports), "\n".join(failures(reports))
    assert {"node id follows the rank", "a new_group over cco"} <= checked(reports)


def test_two_stripes_are_bit_identical_to_one(job: Job, tmp_path: Path) -> None:
    """``Options(stripes=2)``: each stripe's certificate issued on the spot in the job's
    development PKI; all-reduce and DDP steps whose buckets are cut over the stripes
    give the bits of a group with one stripe."""
    reports = run_ranks(job, tmp_path, "stripes", 4, "--stripes", "2")
    assert not failures(reports), "\n".join(failures(reports))
    names = checked(reports)
    assert "stripes: all_reduce bit-identical to one stripe, on every rank" in names
    assert "stripes: DDP with no hook cut buckets over stripe 1" in names
    assert "stripes: reduce_scatter_tensor bit-identical to one stripe" in names
    assert "stripes: DDP with the hook at width 16 bit-identical to one stripe, on every rank" in names
