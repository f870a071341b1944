"""Writes every vector file, and compares a directory with what it would write.

Each vector file has its own module in :mod:`cco.interop.vectorfiles`, its
generator and its check side by side; a new file is one more entry in
:data:`VECTOR_FILES`.  Output is stable (2-space indent, ASCII, a trailing newline,
keys in the order the generator built them) so regenerating leaves the committed
files byte for byte unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from cco.interop.vectorfiles import (
    block_scale,
    block_scale_failures,
    decode_failures,
    framing,
    live_cases,
    live_inputs,
    messages,
    payload_combine,
    payload_keys,
    payload_tags,
    payload_verify_failures,
    wire_forms,
)


class VectorFile(Protocol):
    """A module of :mod:`cco.interop.vectorfiles`."""

    FILE: str

    def vectors(self) -> list[dict[str, Any]]: ...

    def check(self, vectors: list[dict[str, Any]]) -> list[str]: ...


VECTOR_FILES: tuple[VectorFile, ...] = (
    messages,
    decode_failures,
    framing,
    payload_keys,
    payload_tags,
    payload_combine,
    payload_verify_failures,
    wire_forms,
    block_scale,
    block_scale_failures,
    live_inputs,
    live_cases,
)
"""Every vector file, in the order ``cco-interop check`` reports them."""


def render(vectors: list[dict[str, Any]]) -> str:
    """The exact text of one vector file."""
    return json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"


def build(files: Sequence[VectorFile] = VECTOR_FILES) -> dict[str, str]:
    """File name -> file text for every vector file, in a stable order."""
    texts: dict[str, str] = {}
    for module in files:
        if module.FILE in texts:
            raise ValueError(f"{module.FILE} comes from more than one module")
        texts[module.FILE] = render(module.vectors())
    return dict(sorted(texts.items()))


SHIPPED_VECTORS = Path(__file__).resolve().parent / "vectors"
"""The vectors this package ships (package data of a wheel; in a source checkout a
link to ``interop/vectors``)."""


def checkout_vector_dir() -> Path | None:
    """``interop/vectors`` of the source checkout this package runs from, if it does."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "interop" / "vectors").is_dir():
        return root / "interop" / "vectors"
    return None


def default_vector_dir() -> Path:
    """Where ``check`` and ``vectors`` read: the checkout's vectors, else the shipped ones."""
    return checkout_vector_dir() or SHIPPED_VECTORS


def default_output_dir() -> Path:
    """Where ``generate`` writes: the checkout's vectors, else ``interop/vectors`` of the
    current directory (never into an installed package)."""
    return checkout_vector_dir() or Path.cwd() / "interop" / "vectors"


def write(out_dir: Path, files: Sequence[VectorFile] = VECTOR_FILES) -> list[Path]:
    """(Re)write every vector file into ``out_dir``; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, text in build(files).items():
        path = out_dir / file_name
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def compare(directory: Path, files: Sequence[VectorFile] = VECTOR_FILES) -> list[str]:
    """Differences between ``directory`` and a fresh generation: missing, changed, unexpected."""
    expected = build(files)
    problems = []
    for file_name, text in expected.items():
        path = directory / file_name
        if not path.is_file():
            problems.append(f"{file_name}: missing")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"{file_name}: differs from a fresh generation")
    for path in sorted(directory.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path.name}: no module generates this file")
    return problems
