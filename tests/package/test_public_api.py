"""The top-level package: the client API by name, and a wire layer free of QUIC."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cco


def test_every_exported_name_resolves() -> None:
    for name in cco.__all__:
        assert getattr(cco, name) is not None
    with pytest.raises(AttributeError):
        cco.NoSuchThing  # noqa: B018


def test_the_wire_layer_does_not_load_the_quic_stack() -> None:
    code = "import sys, cco.wire.messages, cco.wire.payload; print('aioquic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
