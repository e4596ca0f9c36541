"""The installed commands (``nvpair-proxy``, ``twistd``) beside this interpreter, and running one
to its end in a fresh working directory."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence

from twisted.internet import utils

BIN = os.path.dirname(sys.executable)


COMMAND = os.path.join(BIN, "nvpair-proxy")


TWISTD = os.path.join(BIN, "twistd")


async def run(executable: str, args: Sequence[str]) -> tuple[bytes, bytes, int, list[str]]:
    """Run one command to its end in a fresh working directory: (stdout, stderr, exit
    status, what it left in the directory)."""
    cwd = tempfile.mkdtemp(prefix="nvpair-cwd-")
    out, err, code = await utils.getProcessOutputAndValue(
        executable, list(args), env=dict(os.environ), path=cwd
    )
    return out, err, code, sorted(os.listdir(cwd))
