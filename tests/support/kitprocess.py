"""Child processes of tests: a kit engine (``python -m nvpair.proxy.testing.<engine>``) and its
ready line; any child killed at the test's end."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IProcessTransport, IReactorProcess
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ReadyLine(ProcessProtocol):
    """Collects a child's stdout and reports its first line."""

    def __init__(self) -> None:
        self.out = b""
        self.firstLine: Deferred[bytes] = Deferred()
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data
        if b"\n" in self.out and not self.firstLine.called:
            self.firstLine.callback(self.out.split(b"\n", 1)[0])

    def processEnded(self, reason: Failure) -> None:
        reason.trap(ProcessDone, ProcessTerminated)
        if not self.firstLine.called:
            self.firstLine.errback(reason)
        self.ended.callback(None)


def killAtCleanup(
    case: SynchronousTestCase, process: IProcessTransport, ended: Deferred[Any]
) -> None:
    """At the test's end, kill ``process`` unless it has ended (``ended`` fired); wait for it."""

    def kill() -> Deferred[Any]:
        if not ended.called:
            try:
                process.signalProcess("KILL")
            except ProcessExitedAlready:
                pass
        return ended

    case.addCleanup(kill)


async def spawnKitEngine(
    case: SynchronousTestCase, reactor: object, module: str, *args: str
) -> Any:
    """Start ``python -m module --port 0 *args``, killed at cleanup; its ready line's JSON."""
    proto = ReadyLine()
    argv = [sys.executable, "-m", module, "--port", "0", *args]
    process = IReactorProcess(reactor).spawnProcess(
        proto, sys.executable, argv, env=os.environ, path=ROOT
    )
    killAtCleanup(case, process, proto.ended)
    return json.loads(await proto.firstLine)
