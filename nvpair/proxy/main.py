"""``nvpair-proxy``: the console command, the same process as ``twistd -n nvpair-proxy``.

``nvpair-proxy [options]`` runs ``twistd --reactor=nvpair --nodaemon --pidfile= nvpair-proxy
[options]`` in this interpreter, so the options, the stdio contract (JSON-RPC on stdout, JSON
log lines on stderr) and the exit statuses are exactly those of the twistd plugin; twistd
finds the plugins in ``twisted/plugins/`` (``nvpair_proxy.py``, the service maker, and
``nvpair_reactors.py``, the ``nvpair`` reactor: ``runtime.eventloop``), which every install
of the project provides.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from twisted.scripts import twistd

__all__ = ["main", "twistdArguments"]

NAME = "nvpair-proxy"
REACTOR = "nvpair"


def twistdArguments(args: Sequence[str]) -> list[str]:
    """The twistd command line that ``nvpair-proxy args...`` stands for (the proxy's reactor,
    the foreground, no pidfile: a console command leaves nothing behind in the working
    directory)."""
    return [f"--reactor={REACTOR}", "--nodaemon", "--pidfile=", NAME, *args]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the proxy until it is stopped (the console entry point)."""
    args = sys.argv[1:] if argv is None else list(argv)
    sys.argv = [NAME, *twistdArguments(args)]
    twistd.run()
