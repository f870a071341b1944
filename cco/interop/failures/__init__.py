"""The catalogue of invalid messages behind ``decode_failures.json``.

Each failure starts from one valid sample and breaks exactly one rule, so every
conforming decoder must report the same error code whatever order it checks
things in.  Together they reach every error code the message decoder can raise
and every kind of rule, one module per layer of rules: :mod:`.encoding` (CBOR
well-formedness and the CCO subset, deterministic encoding, size limits),
:mod:`.schema` (the message registry, the message shape, field types, enums,
missing and unknown keys), :mod:`.bounds` (field ranges, derived from the field
declarations) and :mod:`.rules` (cross-field rules and bitmap form).
:mod:`.mutation` is the record they share and the mutations they are built with.
"""

from __future__ import annotations

from cco.interop.failures.bounds import range_failures
from cco.interop.failures.encoding import cbor_failures, determinism_failures, limit_failures
from cco.interop.failures.mutation import Failure
from cco.interop.failures.rules import rule_failures
from cco.interop.failures.schema import (
    enum_failures,
    key_failures,
    shape_failures,
    type_failures,
    type_mismatch_failures,
)


def failures() -> list[Failure]:
    """Every negative message vector, grouped by the error it must raise."""
    found = [
        *cbor_failures(),
        *determinism_failures(),
        *limit_failures(),
        *type_failures(),
        *shape_failures(),
        *type_mismatch_failures(),
        *range_failures(),
        *enum_failures(),
        *rule_failures(),
        *key_failures(),
    ]
    names = [f.name for f in found]
    assert len(set(names)) == len(names), "failure names are unique"
    return found
