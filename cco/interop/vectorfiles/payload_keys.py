"""``payload_keys.json``: the MAC keys k1 and k2 derived from a group secret (HKDF).

The check recomputes every value with :func:`cco.interop.reference.hkdf` (``hmac``
and ``hashlib`` only).
"""

from __future__ import annotations

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import GROUP_ID, SECRET, Vector, checked, run

FILE = "payload_keys.json"
SPEC_SECTION = "mac-construction"


def _vector(name: str, description: str, secret: bytes, group_id: bytes) -> Vector:
    prk, k1 = ref.hkdf(secret, group_id, b"cco/1 mac k1")
    _, k2 = ref.hkdf(secret, group_id, b"cco/1 mac k2")
    return {
        "name": name,
        "description": description,
        "group_secret": secret.hex(),
        "group_id": group_id.hex(),
        "prk": prk.hex(),
        "info_k1": b"cco/1 mac k1".hex(),
        "k1": k1.hex(),
        "info_k2": b"cco/1 mac k2".hex(),
        "k2": k2.hex(),
    }


def vectors() -> list[Vector]:
    built = checked(
        FILE,
        [
            _vector("keys_counting", "group_secret 00..1f, group_id a0..af.", SECRET, GROUP_ID),
            _vector("keys_zero", "All-zero secret and group id.", bytes(32), bytes(16)),
            _vector("keys_ff", "All-ones secret, group id 0f..00.", b"\xff" * 32, bytes(range(15, -1, -1))),
        ],
        check,
    )
    return [v | {"spec_section": SPEC_SECTION} for v in built]


def _check_one(v: Vector) -> list[str]:
    secret, group_id = from_hex(v["group_secret"]), from_hex(v["group_id"])
    prk, k1 = ref.hkdf(secret, group_id, from_hex(v["info_k1"]))
    _, k2 = ref.hkdf(secret, group_id, from_hex(v["info_k2"]))
    want = {"prk": prk.hex(), "k1": k1.hex(), "k2": k2.hex(), "info_k1": b"cco/1 mac k1".hex()}
    want["info_k2"] = b"cco/1 mac k2".hex()
    return [f"{k} differs" for k, value in want.items() if v[k] != value]


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
