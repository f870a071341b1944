"""The machines' next deadline, found in one pass.

The I/O layer asks a machine for its next deadline after every input, so each
machine keeps a running minimum over its timers instead of building a list of them.
"""

from __future__ import annotations


def earlier(earliest: float | None, time: float) -> float:
    """The earlier of a running minimum (None: nothing yet) and ``time``."""
    return time if earliest is None or time < earliest else earliest
