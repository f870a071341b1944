"""``decode_failures.json``: invalid messages, each one valid message broken by one
mutation, with the error code a decoder must report (the catalogue is
:mod:`cco.interop.failures`).

The check decodes each vector with this implementation, under the vector's limits.
"""

from __future__ import annotations

from collections.abc import Callable

from cco.interop.failures import failures
from cco.interop.failures.mutation import Failure, base_bytes
from cco.interop.jsonform import from_hex, limits_from_json, limits_to_json
from cco.interop.vectorfiles.common import Vector, checked, run
from cco.wire.errors import CcoError, DecodeError, ErrorCode
from cco.wire.messages import decode_message

FILE = "decode_failures.json"


def _vector(failure: Failure) -> Vector:
    return {
        "name": failure.name,
        "fail": True,
        "description": failure.description,
        "spec_section": "decoding",
        "mutation": failure.mutation,
        "base_vector": failure.base,
        "base": base_bytes(failure.base).hex(),
        "encoded": failure.encoded.hex(),
        "limits": limits_to_json(failure.limits),
        "error_code": int(failure.error),
        "error_name": failure.error.name,
        "cddl_valid": failure.cddl_valid,
    }


def vectors() -> list[Vector]:
    return checked(FILE, [_vector(f) for f in failures()], check)


def expect_failure(action: Callable[[], object], code: int) -> str | None:
    """None when ``action`` raises a codec error with ``code``, else what happened."""
    try:
        action()
    except CcoError as exc:
        if exc.code == code:
            return None
        return f"failed with {exc.code.name} ({int(exc.code)}) instead of {code}: {exc.detail}"
    return "was accepted"


def _check_one(vector: Vector) -> list[str]:
    """decode(encoded, limits) MUST fail with error_code; the base decodes."""
    try:
        encoded = from_hex(vector["encoded"], "encoded")
        base = from_hex(vector["base"], "base")
        limits = limits_from_json(vector["limits"])
        code = ErrorCode(vector["error_code"])
    except (KeyError, ValueError) as exc:
        return [f"{type(exc).__name__}: {exc}"]
    problems: list[str] = []
    if vector.get("fail") is not True:
        problems.append("a negative vector must have fail: true")
    if vector.get("error_name") != code.name:
        problems.append("error_name does not match error_code")
    outcome = expect_failure(lambda: decode_message(encoded, limits), code)
    if outcome is not None:
        problems.append(f"encoded {outcome}")
    try:
        decode_message(base)
    except DecodeError as exc:
        problems.append(f"base does not decode: {exc}")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
