"""Settings every test shares.

``CCO_STORE=:memory:``: a rendezvous process a test starts without ``--store`` keeps
its state in memory instead of in the default file under the user's home, which
would outlive the test and be restored by the next rendezvous of the same node id
(another test's groups, members away).  Tests of persistence pass ``--store`` with
a path in their temporary directory (flags win over the environment).
"""

from __future__ import annotations

import os

os.environ["CCO_STORE"] = ":memory:"
