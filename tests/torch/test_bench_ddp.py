"""benchmarks/bench_ddp.py's verdicts: step-time ratios and loss differences against
Gloo's, beside the targets (the run itself needs root and takes minutes)."""

from __future__ import annotations

import bench_ddp


def result(seconds: float, loss: float) -> dict[str, object]:
    return {"median_step_seconds": seconds, "final_loss": loss}


def test_verdicts_compare_each_width_with_gloo() -> None:
    rows = bench_ddp.verdicts(
        {
            "Gloo": result(10.0, 1.0),
            "CCO width 32": result(7.0, 1.005),  # 0.70 x, 0.5%: both met
            "CCO width 16": result(5.0, 1.02),  # no time target; 2% misses the loss target
            "CCO width 8": {"failed": "rank 2 exited with 1"},
        }
    )
    verdict = {name: (figure, met) for name, figure, _, met in rows}
    assert verdict["CCO width 32 step time"] == ("0.70 x Gloo", True)
    assert verdict["CCO width 32 final loss"] == ("0.50% from Gloo's", True)
    assert verdict["CCO width 16 step time"] == ("0.50 x Gloo", None)
    assert verdict["CCO width 16 final loss"] == ("2.00% from Gloo's", False)
    assert verdict["CCO width 8"] == ("not measured", False)
