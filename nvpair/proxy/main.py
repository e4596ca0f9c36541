"""``nvpair-proxy``: the console command, the same process as ``twistd -n nvpair-proxy``.

``nvpair-proxy [options]`` runs twistd in the foreground with no pidfile and the proxy as
its only sub-command, so the options, the stdio contract (JSON-RPC on stdout, JSON log
lines on stderr) and the exit statuses are exactly those of ``twistd -n --pidfile=
nvpair-proxy [options]``.  The sub-command is given directly rather than found by twistd's
plugin scan, so the command also works where ``twisted/plugins`` is not on the path.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

from twisted.application import app
from twisted.python.usage import Options as UsageOptions
from twisted.scripts.twistd import ServerOptions, runApp

from nvpair.proxy import tap

__all__ = ["ProxyServerOptions", "main", "twistdArguments"]

NAME = "nvpair-proxy"
DESCRIPTION = "The nvpair engine proxy: one facade per engine, routing inference to model owners."


class ProxyServerOptions(ServerOptions):
    """twistd's options with the proxy as the one sub-command."""

    @property
    def subCommands(self) -> Iterator[tuple[str, None, type[UsageOptions], str]]:  # type: ignore[override]
        yield (NAME, None, tap.Options, DESCRIPTION)


def twistdArguments(args: Sequence[str]) -> list[str]:
    """The twistd command line that ``nvpair-proxy args...`` stands for."""
    return ["--nodaemon", "--pidfile=", NAME, *args]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the proxy in the foreground until it is stopped (the console entry point)."""
    args = sys.argv[1:] if argv is None else list(argv)
    sys.argv = [NAME, *twistdArguments(args)]
    app.run(runApp, ProxyServerOptions)
