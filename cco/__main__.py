"""``python -m cco``: the same as ``cco-node``."""

import sys

from cco.cli import main

sys.exit(main())
