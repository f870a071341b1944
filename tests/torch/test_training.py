"""Training over the "cco" backend: DDP with and without the CCO hook, and FSDP2.

Four ranks run both (one start of the processes), against one standalone job; see
``torch_worker.py`` for the bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'cco[torch]')")

from torch_ranks import checked, failures, run_ranks, standalone


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    with standalone(tmp_path_factory.mktemp("job")) as job:
        yield run_ranks(job, tmp_path_factory.mktemp("ranks"), "train", 4, timeout=400)


def test_ddp_over_cco_matches_gloo_within_the_bound_at_each_width(reports: list[dict[str, Any]]) -> None:
    """20 steps: parameters identical on every rank, within the documented bound of the
    same run over Gloo, without the hook and with it at widths 32, 16 and 8; an
    overflowing gradient on one rank makes every rank's GradScaler skip the step."""
    ddp = [{**r, "checks": [c for c in r["checks"] if not c["name"].startswith("FSDP2")]} for r in reports]
    assert not failures(ddp), "\n".join(failures(ddp))
    names = checked(reports)
    for width in (32, 16, 8):
        assert f"DDP hook at width {width}: within the bound of the Gloo run" in names
        assert f"DDP hook at width {width}: parameters identical on every rank" in names
    assert "GradScaler: the overflowing step is skipped" in names


def test_fsdp2_trains_on_cpu_over_cco(reports: list[dict[str, Any]]) -> None:
    fsdp = [{**r, "checks": [c for c in r["checks"] if c["name"].startswith("FSDP2")]} for r in reports]
    assert not failures(fsdp), "\n".join(failures(fsdp))
    assert "FSDP2: trains as one process on every rank's batch" in checked(reports)
