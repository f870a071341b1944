"""Settings every test shares.

``CCO_STORE=:memory:``: a rendezvous process a test starts without ``--store`` keeps
its state in memory instead of in the default file under the user's home, which
would outlive the test and be restored by the next rendezvous of the same node id
(another test's groups, members away).  Tests of persistence pass ``--store`` with
a path in their temporary directory (flags win over the environment).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from cco.transport.config import QUIC_BACKEND_ENV
from cco.wire import kernels

os.environ["CCO_STORE"] = ":memory:"


# --- QUIC backend ----------------------------------------------------------------
#
# A module marked ``pytestmark = pytest.mark.quic_backends()`` runs each test once per
# QUIC backend: the ``quic_backend`` fixture sets CCO_QUIC_BACKEND, the default of
# ``TransportConfig.quic_backend``, for the test.  ``quic_backends("aioquic")`` names
# the backends explicitly (a module that tests one backend's internals on purpose,
# saying why).  Other tests use the environment's choice (``CCO_QUIC_BACKEND=aioquic
# pytest`` runs the whole suite on aioquic), else qh3.

QUIC_BACKENDS = ("aioquic", "qh3")

# --- the per-chunk arithmetic ---------------------------------------------------------
#
# A module marked ``pytest.mark.both_kernels`` runs each test once on each path of the
# per-chunk arithmetic: the compiled loops (numba) and numpy (``CCO_KERNELS``, see
# cco/wire/kernels.py).  Where numba is not installed the compiled run is skipped,
# saying so.  Other tests use the environment's choice.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quic_backends(*names): run each test once per QUIC backend")
    config.addinivalue_line("markers", "both_kernels: run each test on the compiled loops and on numpy")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends = metafunc.definition.get_closest_marker("quic_backends")
    if backends is not None and "quic_backend" in metafunc.fixturenames:
        metafunc.parametrize("quic_backend", backends.args or QUIC_BACKENDS, indirect=True)
    kernels_marker = metafunc.definition.get_closest_marker("both_kernels")
    if kernels_marker is not None and "inner_product_path" in metafunc.fixturenames:
        metafunc.parametrize("inner_product_path", kernels.CHOICES, indirect=True)


@pytest.fixture(autouse=True)
def quic_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    backend: str | None = getattr(request, "param", None)
    if backend is not None:
        monkeypatch.setenv(QUIC_BACKEND_ENV, backend)
    return backend or os.environ.get(QUIC_BACKEND_ENV, "qh3")


@pytest.fixture(autouse=True)
def inner_product_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    choice: str | None = getattr(request, "param", None)
    if choice == "numba" and importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed (pip install '.[fast]'): the compiled loops are not tested")
    if choice is not None:
        monkeypatch.setenv(kernels.KERNELS_ENV, choice)
    kernels.reset()
    yield kernels.active() if choice is not None else kernels.chosen()
    kernels.reset()
