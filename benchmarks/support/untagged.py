"""Run ``cco-node`` with every MAC tag zero: the benchmark's "tags off" side.

Issue 8 asks what authentication costs (tags on / tags off at most 1.10 on the
line-rate case) and allows a benchmark-only switch; the product gets none.  This
launcher replaces, in its own process only, the two MAC functions the payload layer
calls per chunk (:func:`~cco.wire.mac.contribution_tag` when sealing and
:func:`~cco.wire.mac.expected_tag` when verifying: the inner product <u, x>, an
AES-CTR keystream and a sum mod p over every integer, and the per-rank HMAC pads)
by constants zero, and then runs the normal ``cco-node`` main with the same
arguments.  Every tag is then 0: contributors send 0, aggregators add zeros, and
verifiers expect 0, so the wire keeps its shape (a tag is still sent and checked)
and every check still passes, while no key material is used.  Only endpoints tag;
run aggregators and the rendezvous as usual.  A node launched this way cannot talk
to one that tags: their tags disagree and verification fails, as it must.

The functions are replaced where :mod:`cco.wire.payload` looks them up, not inside
:mod:`cco.wire.mac`: replacing the MAC's inner parts (as this launcher did until the
sealer's pad came to be kept for verifying) leaves whatever path does not go
through them tagging for real.

    python benchmarks/support/untagged.py --role endpoint --node-id ep-0 ...   # any cco-node arguments
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cco import cli

if TYPE_CHECKING:
    import numpy as np

    from cco.wire.mac import GroupKeys


def _zero_contribution_tag(
    keys: GroupKeys, chunk_id: bytes, rank: int, values: np.ndarray, keep: object = None
) -> int:
    return 0


def _zero_expected_tag(
    keys: GroupKeys, chunk_id: bytes, ranks: Iterable[int], values: np.ndarray, reuse: object = None
) -> int:
    return 0


def disable_tagging() -> None:
    """Make every tag this process computes or expects zero (see the module docstring)."""
    from cco.wire import payload  # after single_threaded_numerics(): it imports numpy

    payload.contribution_tag = _zero_contribution_tag
    payload.expected_tag = _zero_expected_tag


if __name__ == "__main__":
    cli.single_threaded_numerics()  # as cli.main() would, before numpy is first imported
    disable_tagging()
    sys.exit(cli.main())
