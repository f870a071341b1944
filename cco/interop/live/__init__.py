"""``cco-interop live``: test cases between running implementations, judged from artifacts.

For each case the runner writes a PKI, starts the nodes the case needs (each from
the implementation chosen for its role, as a command given the environment
contract of ``interop/README.md``), on loopback, waits for the endpoints, stops
the servers, and judges from what the nodes left behind: exit codes, the results
files endpoints write (compared with results the runner recomputes from the
deterministic inputs of :mod:`cco.workload`), logs, TLS key logs and qlog files.
An implementation's own claim of success is never taken.  A node exiting with
127 makes the case *unsupported* for that combination.

The parts: :mod:`.nodes` (starting, stopping and reading a case's nodes),
:mod:`.cases` (the cases and their judges) and :mod:`.runner` (every case in every
combination, the matrix, the command).  The names below are those the tests and
other tools reach through this package.
"""

from cco.interop import expected
from cco.interop.live.cases import CASES, Case, Workload, judge_exact
from cco.interop.live.nodes import CaseFailed, Node, Relays, Run, free_port
from cco.interop.live.runner import (
    FAILED,
    OUR_ADAPTER,
    PASSED,
    UNSUPPORTED,
    Outcome,
    combinations,
    matrix_json,
    matrix_text,
    run_case,
)

__all__ = [
    "CASES",
    "FAILED",
    "OUR_ADAPTER",
    "PASSED",
    "UNSUPPORTED",
    "Case",
    "CaseFailed",
    "Node",
    "Outcome",
    "Relays",
    "Run",
    "Workload",
    "combinations",
    "expected",
    "free_port",
    "judge_exact",
    "matrix_json",
    "matrix_text",
    "run_case",
]
