"""Settings every test shares.

``CCO_STORE=:memory:``: a rendezvous process a test starts without ``--store`` keeps
its state in memory instead of in the default file under the user's home, which
would outlive the test and be restored by the next rendezvous of the same node id
(another test's groups, members away).  Tests of persistence pass ``--store`` with
a path in their temporary directory (flags win over the environment).
"""

from __future__ import annotations

import os

import pytest

from cco.transport.config import TransportConfig

os.environ["CCO_STORE"] = ":memory:"


# --- QUIC backend ----------------------------------------------------------------
#
# The transport tests (tests/test_transport*.py) run once per QUIC backend: the
# ``quic_backend`` fixture makes it the default of ``TransportConfig.quic_backend``
# for the test.  A module that tests one backend's internals on purpose sets
# ``QUIC_BACKENDS`` to that backend alone, saying why.  Other tests use the default.

QUIC_BACKENDS = ("aioquic", "qh3")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "quic_backend" in metafunc.fixturenames and metafunc.module.__name__.startswith("test_transport"):
        backends = getattr(metafunc.module, "QUIC_BACKENDS", QUIC_BACKENDS)
        metafunc.parametrize("quic_backend", backends, indirect=True)


@pytest.fixture(autouse=True)
def quic_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    backend: str = getattr(request, "param", "aioquic")
    if backend != "aioquic":
        defaults = TransportConfig.__init__.__kwdefaults__
        assert defaults is not None
        monkeypatch.setitem(defaults, "quic_backend", backend)
    return backend
