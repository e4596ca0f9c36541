"""What the real-process tests in this folder share that ``tests.support`` does not hold."""

from __future__ import annotations

import os
import sys

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
"""The ``twistd`` installed beside this interpreter, for tests that spawn it themselves."""
