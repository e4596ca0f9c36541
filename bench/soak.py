"""The chaos soak in long mode (issue 8): 20,000 requests by default, figures on stdout.

    .venv/bin/python -m bench.soak [--requests 20000] [--concurrency 24] [--seed N]

The same engine as the CI test (``tests/support/chaos/``): a faulty fleet of fake engines,
discovery and scheduler churn, an oracle for every answer, and end-of-run leak checks.  Exits 1
when a violation was found.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, task

from tests.support.chaos import ChaosConfig, Soak


class Cleanups:
    """What a ``TestCase`` offers the soak: cleanups run last-in first-out at the end."""

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def addCleanup(self, f: Callable[..., Any], *args: Any) -> None:
        """Register ``f(*args)`` to run at the end."""
        self._calls.append((f, args))

    async def run(self) -> None:
        """Run every cleanup, waiting on those that return a Deferred."""
        while self._calls:
            f, args = self._calls.pop()
            try:
                await defer.maybeDeferred(f, *args)
            except Exception as e:  # keep cleaning up
                sys.stderr.write(f"cleanup failed: {e!r}\n")


def _progress(text: str) -> None:
    sys.stderr.write(text + "\n")


async def main(reactor: Any, argv: list[str]) -> None:
    """Run one long soak and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--seed", type=int, default=ChaosConfig().seed)
    parser.add_argument("--log-level", default="debug")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        seed=args.seed,
        logLevel=args.log_level,
        progress=_progress,
    )
    cleanups = Cleanups()
    try:
        report = await Soak(cleanups, reactor, config).run()
    finally:
        await cleanups.run()
    sys.stdout.write(report.text() + "\n")
    if report.violations:
        raise SystemExit(1)


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, sys.argv[1:])))
