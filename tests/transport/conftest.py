"""Fixtures of the transport tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cco.transport.certs import create_dev_pki
from cco.wire.registries import Role


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A development PKI for one aggregator (agg-1) and one endpoint (ep-1); a test
    module that needs other nodes defines its own ``pki``."""
    directory = tmp_path_factory.mktemp("pki")
    create_dev_pki(directory, [("agg-1", Role.AGGREGATOR), ("ep-1", Role.ENDPOINT)])
    return directory
