"""Integration fixture for standalone mode: the real ``twistd -n nvpair-proxy --standalone``.

Standalone mode has no broker, so there is no JSON-RPC handshake to wait for: the fixture
gives each enabled facade a free port through a persisted port file (protocol §7 applies
in standalone mode too), reads the JSON log lines on stderr, and is ready once every
facade has logged ``facade-enabled``.  It stops the process with SIGTERM in cleanup.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from nvpair.proxy.engines import ENGINES
from tests.harness import freePort


class _Protocol(ProcessProtocol):
    """Collects stdout and the stderr log lines of the proxy process."""

    def __init__(self, owner: StandaloneProxy) -> None:
        self.owner = owner
        self.stdout = b""
        self._errBuffer = b""
        self.ended: defer.Deferred[Any] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.stdout += data

    def errReceived(self, data: bytes) -> None:
        self._errBuffer += data
        *lines, self._errBuffer = self._errBuffer.split(b"\n")
        for line in lines:
            self.owner._line(line)

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


class StandaloneProxy:
    """One standalone proxy process with one free port per enabled facade."""

    def __init__(
        self,
        test: TestCase,
        reactor: Any,
        engines: Sequence[str],
        backends: Sequence[tuple[str, str]] = (),
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.test = test
        self.reactor = reactor
        self.engines = tuple(engines)
        self.stateDir = tempfile.mkdtemp(prefix="nvpair-standalone-")
        self.ports: dict[str, int] = {}
        for engineId in self.engines:
            port = freePort()
            self.ports[engineId] = port
            with open(os.path.join(self.stateDir, ENGINES[engineId].portFile), "w") as f:
                json.dump({"port": port}, f)
        argv = ["--standalone", "--state-dir", self.stateDir, "--ops-port", "0",
                "--engines", ",".join(self.engines)]
        for engineId, url in backends:
            argv += ["--backend", f"{engineId}={url}"]
        argv += list(extra)
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.command = [twistd, "-n", "--pidfile=", "nvpair-proxy", *argv]
        self.environ = dict(os.environ)
        self.environ.pop("NVPAIR_STATE_DIR", None)
        self.environ.pop("NVPAIR_PROXY_OPS_PORT", None)
        if env:
            self.environ.update(env)
        self.logs: list[dict[str, Any]] = []
        self._watchers: list[tuple[Callable[[dict[str, Any]], bool], defer.Deferred[Any]]] = []
        self.proto: _Protocol | None = None

    def url(self, engineId: str) -> str:
        """The base URL of a facade."""
        return f"http://127.0.0.1:{self.ports[engineId]}"

    def _line(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
        except ValueError:
            record = {"event": "unparsed", "text": raw.decode("utf-8", "replace")}
        if not isinstance(record, dict):
            return
        self.logs.append(record)
        for watcher in list(self._watchers):
            predicate, d = watcher
            if predicate(record):
                self._watchers.remove(watcher)
                d.callback(record)

    def waitForLog(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> defer.Deferred[dict[str, Any]]:
        """A log record already seen, or the next one, matching ``predicate``."""
        for record in self.logs:
            if predicate(record):
                return defer.succeed(record)
        d: defer.Deferred[dict[str, Any]] = defer.Deferred()
        self._watchers.append((predicate, d))
        return d.addTimeout(timeout, self.reactor)

    def events(self, name: str) -> list[dict[str, Any]]:
        """The log records with ``event`` equal to ``name``."""
        return [r for r in self.logs if r.get("event") == name]

    async def start(self) -> None:
        """Spawn the process and wait until every facade is listening."""
        self.proto = _Protocol(self)
        self.test.addCleanup(self.stop)
        self.reactor.spawnProcess(self.proto, self.command[0], self.command, env=self.environ,
                                  path=self.stateDir)
        for engineId in self.engines:
            await self.waitForLog(
                lambda r, e=engineId: r.get("event") == "facade-enabled" and r.get("engine") == e
            )

    def stop(self) -> defer.Deferred[Any]:
        """SIGTERM, then SIGKILL after 10 s; fires with the exit code."""
        proto = self.proto
        if proto is None or proto.ended.called:
            return defer.succeed(None)
        killer = self.reactor.callLater(10.0, self._signal, "KILL")
        self._signal("TERM")

        def disarm(code: Any) -> Any:
            if killer.active():
                killer.cancel()
            return code

        return proto.ended.addCallback(disarm)

    def _stderrReader(self) -> Any:
        assert self.proto is not None and self.proto.transport is not None
        return self.proto.transport.pipes[2]  # type: ignore[attr-defined]

    def holdLog(self) -> None:
        """Stop reading the process's stderr (a broker that stopped draining it)."""
        self._stderrReader().stopReading()

    def releaseLog(self) -> None:
        """Read the process's stderr again."""
        self._stderrReader().startReading()

    def _signal(self, name: str) -> None:
        proto = self.proto
        if proto is None or proto.transport is None:
            return
        try:
            proto.transport.signalProcess(name)
        except ProcessExitedAlready:
            pass
