"""benchmarks/probes/profile_round.py: perf's samples are read with and without call chains,
each is charged to the right process, library and Python function, and a real run
charges the endpoints and the aggregator, so the CPU table in BENCHMARKS.md stays
reproducible."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import profile_round  # benchmarks/ is not a package: found through the path set above
import pytest
from profile_round import Sample, library_of, parse_samples, python_function, report, tally

FLAT = """\
         swapper     0 48387.197713:  ffffffff8225f42b pv_native_safe_halt ([kernel.kallsyms])
          python  7521 48387.198000:      7f09c9faa13d _PyObject_New (/opt/py/lib/libpython3.11.so.1.0)
          python  7522 48387.198500:      7f09c9faa13d ufunc_reduce (/v/site-packages/numpy/_core/_umath.so)
"""

CHAINS = """\
python  7975 48390.000100:
\tffffffff8226dbf9 _raw_spin_unlock_irqrestore ([kernel.kallsyms])
\t          10ad0c __libc_sendto (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t            eb69 sock_call (inlined)
\t    7f72dc5f92ab py::BatchedUdpTransport.sendto:/tree/cco/transport/udp.py (/tmp/perf-7975.map)

python  7976 48390.000600:
\t            26cd select_epoll_poll_impl (inlined)
\t            26cd select_epoll_poll (/opt/py/lib-dynload/select.so)
\t    7f11aea7f4fa py::EpollSelector.select:/opt/py/lib/python3.12/selectors.py (/tmp/perf-7976.map)

python  7977 48390.001100:
\t          19f0e0 PyList_New (/opt/py/lib/libpython3.12.so.1.0)
"""


def test_flat_samples_are_charged_to_their_process_and_library() -> None:
    samples = list(parse_samples(FLAT.splitlines()))
    assert samples == [
        Sample(0, 48387.197713, "kernel", ""),
        Sample(7521, 48387.198, "interpreter", ""),
        Sample(7522, 48387.1985, "numpy", ""),
    ]


def test_a_call_chain_names_its_innermost_python_function_and_its_leaf_library() -> None:
    samples = list(parse_samples(CHAINS.splitlines()))
    assert samples == [
        Sample(7975, 48390.0001, "kernel", "BatchedUdpTransport.sendto (transport/udp.py)"),
        # an inlined leaf is charged to the object it was inlined into
        Sample(7976, 48390.0006, "select.so", "EpollSelector.select (selectors.py)"),
        Sample(7977, 48390.0011, "interpreter", ""),
    ]


@pytest.mark.parametrize(
    ("dso", "library"),
    [
        ("/venv/lib/python3.12/site-packages/qh3/_hazmat.abi3.so", "qh3"),
        ("/venv/lib/python3.12/site-packages/cryptography/hazmat/bindings/_rust.abi3.so", "cryptography"),
        ("/venv/lib/python3.12/site-packages/_cbor2.cpython-312-x86_64-linux-gnu.so", "cbor2"),
        ("/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "OpenSSL"),
        ("/opt/py/bin/python3.12", "interpreter"),
        ("/tmp/perf-7975.map", "interpreter"),
        ("[vdso]", "[vdso]"),
    ],
)
def test_libraries_are_named_by_what_they_are(dso: str, library: str) -> None:
    assert library_of(dso) == library


def test_python_functions_are_named_by_their_place_in_the_tree() -> None:
    assert python_function("py::combine:/a/b/cco/wire/payload.py") == "combine (wire/payload.py)"
    assert python_function("py::f:/v/lib/python3.12/site-packages/numpy/x.py") == "f (numpy/x.py)"
    assert python_function("py::<module>:/opt/py/lib/python3.12/selectors.py") == "<module> (selectors.py)"


def test_the_report_charges_roles_and_scales_by_the_rounds() -> None:
    samples = [
        Sample(0, 1.0, "kernel", ""),
        Sample(10, 1.1, "interpreter", "f (wire/a.py)"),
        Sample(10, 1.2, "numpy", "f (wire/a.py)"),
        Sample(11, 1.3, "interpreter", "g (nodes/b.py)"),
        Sample(99, 1.4, "kernel", ""),
    ]
    figures = report(tally(samples, {10: "endpoint", 11: "aggregator"}), rounds=2, seconds=0.4, top=5)
    roles = figures["roles"]
    assert set(roles) == {"idle", "endpoint", "aggregator", "other"}
    assert roles["endpoint"]["share"] == pytest.approx(0.4)
    assert roles["endpoint"]["libraries"] == {"interpreter": 0.5, "numpy": 0.5}
    assert roles["endpoint"]["functions"] == {"f (wire/a.py)": 1.0}
    sample_ms = 1e3 / profile_round.FREQUENCY
    assert roles["aggregator"]["cpu_ms_per_round"] == pytest.approx(sample_ms / 2)
    assert roles["idle"]["functions"] == {}


def test_rounds_are_counted_by_their_first_call_inside_the_window() -> None:
    reports = [
        {"rounds": [{"started": 1.0}, {"started": 2.0}, {"started": 3.0}]},
        {"rounds": [{"started": 0.5}, {"started": 2.5}, {"started": 3.5}]},
    ]
    assert profile_round._rounds_in(reports, 0.9, 3.2) == 2  # rounds starting 2.0 and 3.0
    assert profile_round._rounds_in(reports, 0.4, 0.6) == 1


def _perf_unusable() -> str | None:
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        record = [perf, "record", "-a", "-e", "cpu-clock", "-o", f"{tmp}/perf.data", "--", "true"]
        probe = subprocess.run(record, capture_output=True)
    return None if probe.returncode == 0 else "perf record -a is not permitted here (needs root)"


PERF_UNUSABLE = _perf_unusable()


@pytest.mark.skipif(PERF_UNUSABLE is not None, reason=str(PERF_UNUSABLE))
def test_a_real_run_charges_the_endpoints_and_the_aggregator(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    script = Path(profile_round.__file__)
    args = ["--rounds", "4000", "--seconds", "0.5", "--settle", "0", "--out", str(out)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    roles = figures["roles"]
    assert {"endpoint", "aggregator"} <= set(roles)
    assert sum(row["share"] for row in roles.values()) == pytest.approx(1.0)
    assert figures["rounds"] > 0
    assert roles["endpoint"]["cpu_ms_per_round"] > 0
    assert "interpreter" in roles["endpoint"]["libraries"]
