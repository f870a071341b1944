"""The record of one invalid message, and the mutations every failure is built with.

A failure starts from one valid sample of :mod:`cco.interop.samples` and changes
one thing in it; these helpers name that change (a field replaced or removed, a
body replaced, bytes cut) so each catalogue module reads as a list of rules broken.

``cddl_valid`` says what ``spec/cco.cddl`` makes of the bytes: ``False`` when the
schema rejects them, ``True`` when the broken rule is one CDDL cannot state (a
cross-field rule or a bitmap's trailing zero byte), ``None`` when the CBOR layer
rejects the bytes (codes 0x02-0x06) before a schema could apply.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from cco.interop.rawcbor import RawValue, encode_raw
from cco.interop.samples import samples
from cco.interop.samples.common import Sample
from cco.wire import cbor
from cco.wire.cbor import DEFAULT_LIMITS, DecodeLimits
from cco.wire.errors import ErrorCode
from cco.wire.messages import encode_message


@dataclass(frozen=True, slots=True)
class Failure:
    """One invalid encoding, the sample it was derived from and the error it must raise."""

    name: str
    base: str
    error: ErrorCode
    cddl_valid: bool | None
    description: str
    mutation: str
    encoded: bytes
    limits: DecodeLimits = field(default=DEFAULT_LIMITS)


@cache
def samples_by_name() -> dict[str, Sample]:
    """The valid samples, by name."""
    return {s.name: s for s in samples()}


def base_bytes(name: str) -> bytes:
    """The encoding of the valid sample ``name``."""
    return encode_message(samples_by_name()[name].message)


def base_value(name: str) -> list[Any]:
    """A fresh copy of the sample's CBOR data item ``[type, body]``, to mutate."""
    value = cbor.decode(base_bytes(name))
    assert isinstance(value, list)
    return copy.deepcopy(value)


Path = tuple[int | str, ...]
"""Keys and list indices leading from the body to one item."""


def walk(container: Any, path: Path) -> Any:
    """The item at ``path`` inside ``container``."""
    for step in path:
        container = container[step]
    return container


def with_field(name: str, path: Path, value: RawValue) -> bytes:
    """The sample with the item at ``path`` inside its body replaced by ``value``."""
    item = base_value(name)
    walk(item[1], path[:-1])[path[-1]] = value
    return encode_raw(item)


def without_field(name: str, path: Path) -> bytes:
    """The sample with the body entry at ``path`` removed."""
    item = base_value(name)
    del walk(item[1], path[:-1])[path[-1]]
    return encode_raw(item)


def with_body(name: str, body: RawValue) -> bytes:
    """The sample's type code with ``body`` in place of its body."""
    return encode_raw([base_value(name)[0], body])


def cut_after(data: bytes, marker: bytes) -> bytes:
    """``data`` up to and including the only occurrence of ``marker``."""
    assert data.count(marker) == 1
    return data[: data.index(marker) + len(marker)]


def invalid_field(
    name: str,
    base: str,
    description: str,
    mutation: str,
    path: Path,
    value: RawValue,
    *,
    cddl_valid: bool = False,
) -> Failure:
    """Base vector ``base`` with the field at ``path`` set to ``value``: INVALID_FIELD.

    ``cddl_valid`` says whether the result still matches the schema (the rule broken
    is one CDDL cannot state) or not.
    """
    return Failure(
        name, base, ErrorCode.INVALID_FIELD, cddl_valid, description, mutation, with_field(base, path, value)
    )
