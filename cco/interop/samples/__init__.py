"""The catalogue of valid messages behind ``messages.json``.

Each sample is chosen to pin down one thing an independent implementation could
get wrong: the smallest and largest value of a range, an optional field present
and absent, an empty bitmap where one is allowed, a multi-byte UTF-8 string at its
byte limit, CBOR length boundaries (23/24, 255/256), nested structures.  One module
per family of messages: :mod:`.connection`, :mod:`.status`, :mod:`.membership`,
:mod:`.topology` and :mod:`.chunks` (the data plane); :mod:`.common` is the sample
record and the fixed inputs they share, so the catalogue is the same on every run
and every machine.
"""

from __future__ import annotations

from cco.interop.samples.chunks import chunk_samples
from cco.interop.samples.common import Sample
from cco.interop.samples.connection import FULL_CAPABILITIES, connection_samples
from cco.interop.samples.membership import membership_samples
from cco.interop.samples.status import status_samples
from cco.interop.samples.topology import topology_samples
from cco.wire.registries import MessageType

__all__ = ["FULL_CAPABILITIES", "samples"]
"""What code outside the package names here: the tests' Hello capabilities, and
the catalogue."""


def samples() -> list[Sample]:
    """Every valid sample, grouped by message type in registry order."""
    found = [
        *connection_samples(),
        *status_samples(),
        *membership_samples(),
        *topology_samples(),
        *chunk_samples(),
    ]
    names = [s.name for s in found]
    assert len(set(names)) == len(names), "sample names are unique"
    assert {s.message.TYPE for s in found} == set(MessageType), "every message type has a sample"
    return sorted(found, key=lambda s: int(s.message.TYPE))
