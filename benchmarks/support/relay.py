"""The testbed's UDP relay (delay and loss each way) is the interop runner's:
:mod:`cco.interop.relay`.  This name stays for the benchmarks and tests that import
``relay`` from here, and for running it as a script in a namespace."""

from __future__ import annotations

import sys

from cco.interop.relay import Counters, Profile, main, start

__all__ = ["Counters", "Profile", "main", "start"]

if __name__ == "__main__":
    sys.exit(main())
