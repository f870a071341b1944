"""Writes every vector file, and compares a directory with what it would write.

Vectors come from providers: functions returning ``{file name: [vector, ...]}``.
A new kind of vector is one more entry in :data:`PROVIDERS`.  Output is stable
(2-space indent, ASCII, a trailing newline, keys in the order the provider
built them) so regenerating leaves the committed files byte for byte unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cco.interop import vectors_blockscale, vectors_messages, vectors_payload

Provider = Callable[[], dict[str, list[dict[str, Any]]]]

PROVIDERS: list[Provider] = [
    vectors_messages.vector_files,
    vectors_payload.vector_files,
    vectors_blockscale.vector_files,
]
"""Every source of vector files; a file name may come from one provider only."""


def render(vectors: list[dict[str, Any]]) -> str:
    """The exact text of one vector file."""
    return json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"


def build(providers: Sequence[Provider] = PROVIDERS) -> dict[str, str]:
    """File name -> file text for every provider, in a stable order."""
    texts: dict[str, str] = {}
    for provider in providers:
        for file_name, vectors in provider().items():
            if file_name in texts:
                raise ValueError(f"{file_name} comes from more than one provider")
            texts[file_name] = render(vectors)
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


def write(out_dir: Path, providers: Sequence[Provider] = PROVIDERS) -> list[Path]:
    """(Re)write every vector file into ``out_dir``; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, text in build(providers).items():
        path = out_dir / file_name
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def compare(directory: Path, providers: Sequence[Provider] = PROVIDERS) -> list[str]:
    """Differences between ``directory`` and a fresh generation: missing, changed, unexpected."""
    expected = build(providers)
    problems = []
    for file_name, text in expected.items():
        path = directory / file_name
        if not path.is_file():
            problems.append(f"{file_name}: missing")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"{file_name}: differs from a fresh generation")
    for path in sorted(directory.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path.name}: no provider generates this file")
    return problems
