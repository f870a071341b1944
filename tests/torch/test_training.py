"""Training over the "cco" backend: DDP with and without the CCO hook, and FSDP2.

Four ranks, one standalone job for the module (see ``torch_worker.py`` for the bounds).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'cco[torch]')")

from torch_ranks import checked, failures, run_ranks, standalone

from cco.standalone import Job


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    with standalone(tmp_path_factory.mktemp("job")) as running:
        yield running


def test_ddp_over_cco_matches_gloo_within_the_bound_at_each_width(job: Job, tmp_path: Path) -> None:
    """20 steps: parameters identical on every rank, within the documented bound of the
    same run over Gloo, without the hook and with it at widths 32, 16 and 8; an
    overflowing gradient on one rank makes every rank's GradScaler skip the step."""
    reports = run_ranks(job, tmp_path, "ddp", 4)
    assert not failures(reports), "\n".join(failures(reports))
    names = checked(reports)
    for width in (32, 16, 8):
        assert f"DDP hook at width {width}: within the bound of the Gloo run" in names
    assert "GradScaler: the overflowing step is skipped" in names


def test_fsdp2_trains_on_cpu_over_cco(job: Job, tmp_path: Path) -> None:
    reports = run_ranks(job, tmp_path, "fsdp", 4)
    assert not failures(reports), "\n".join(failures(reports))
    assert "FSDP2: trains as one process on every rank's batch" in checked(reports)
