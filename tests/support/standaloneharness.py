"""Integration fixture for standalone mode: the real ``twistd -n nvpair-proxy --standalone``.

Standalone mode has no broker, so there is no JSON-RPC handshake to wait for: the fixture
gives each enabled facade a free port through a persisted port file (protocol §7 applies
in standalone mode too), reads the JSON log lines on stderr, and is ready once every
facade has logged ``facade-enabled`` on that port.  Each port is held for the process
(``PortReservation``) until then: a port merely free a moment ago can be taken by a
concurrent test before the process binds it, and the proxy then listens on its engine's
default port instead (spec §3.2), leaving the test talking to whatever holds the port.
It stops the process with SIGTERM in cleanup.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ProcessExitedAlready
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from zope.interface import implementer

from nvpair.proxy.engines import ENGINES
from tests.support.harness import PortReservation


class _Protocol(ProcessProtocol):
    """Collects stdout; ``ended`` fires with the exit code once the process has exited and
    its stderr (a pipe of the fixture's own, read by ``_StderrReader``) is at end of file."""

    def __init__(self, owner: StandaloneProxy) -> None:
        self.owner = owner
        self.stdout = b""
        self.exitCode: Any = None
        self.exited = False
        self.stderrClosed = False
        self.ended: defer.Deferred[Any] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.stdout += data

    def processEnded(self, reason: Failure) -> None:
        self.exitCode = getattr(reason.value, "exitCode", None)
        self.exited = True
        self._maybeEnded()

    def stderrEnded(self) -> None:
        """The stderr pipe reached end of file (every log line has been read)."""
        self.stderrClosed = True
        self._maybeEnded()

    def _maybeEnded(self) -> None:
        if self.exited and self.stderrClosed and not self.ended.called:
            self.ended.callback(self.exitCode)


@implementer(IReadDescriptor)
class _StderrReader:
    """The read end of the process's stderr pipe, registered with the reactor as a reader:
    ``holdLog`` and ``releaseLog`` remove and re-add it (``IReactorFDSet``), so the test can
    stop draining stderr the way a stalled broker would."""

    def __init__(self, fd: int, owner: StandaloneProxy, proto: _Protocol) -> None:
        self.fd = fd
        self.owner = owner
        self.proto = proto
        self.buffer = b""
        self.closed = False

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "proxy-stderr"

    def doRead(self) -> Failure | None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return None
        if not data:
            return Failure(ConnectionDone())
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.owner._line(line)
        return None

    def connectionLost(self, reason: Failure) -> None:
        self.close()
        self.proto.stderrEnded()

    def close(self) -> None:
        """Close the read end (once)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def facadeEnabled(engineId: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the log record of ``engineId``'s facade being enabled (a JSON record, or
    its line in ``--log-format text``)."""
    text = f" facade-enabled engine={engineId} "
    return lambda r: (
        (r.get("event") == "facade-enabled" and r.get("engine") == engineId)
        or (r.get("event") == "unparsed" and text in r["text"])
    )


def facadeReported(engineId: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the log record that settles ``engineId``'s facade at start: enabled (on
    some port) or ``bind-failed`` (JSON, or text as in ``facadeEnabled``)."""
    enabled = facadeEnabled(engineId)
    text = f" bind-failed engine={engineId} "
    return lambda r: (
        enabled(r)
        or (r.get("event") == "bind-failed" and r.get("engine") == engineId)
        or (r.get("event") == "unparsed" and text in r["text"])
    )


def listeningPort(record: dict[str, Any]) -> int | None:
    """The port a ``facade-enabled`` record (JSON or text) says the facade listens on."""
    if record.get("event") == "facade-enabled":
        port = record.get("port")
        return port if isinstance(port, int) else None
    found = re.search(r" facade-enabled engine=\S+ port=(\d+) ", record.get("text", ""))
    return int(found.group(1)) if found else None


def backendUp(url: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the log record of the backend at ``url`` answering its first inventory poll."""
    return lambda r: r.get("event") == "backend-up" and r["url"] == url


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
        fleet: str | None = None,
    ) -> None:
        self.test = test
        self.reactor = reactor
        self.engines = tuple(engines)
        self.stateDir = tempfile.mkdtemp(prefix="nvpair-standalone-")
        self.ports: dict[str, int] = {}
        self._held: list[PortReservation] = []
        test.addCleanup(self._releasePorts)  # when the process never got to listen
        for engineId in self.engines:
            held = PortReservation()
            self._held.append(held)
            port = self.ports[engineId] = held.port
            with open(os.path.join(self.stateDir, ENGINES[engineId].portFile), "w") as f:
                json.dump({"port": port}, f)
        argv = [
            "--standalone",
            "--state-dir",
            self.stateDir,
            "--ops-port",
            "0",
        ]
        # A fleet file names the facades itself (``engines`` still gets them ports).
        argv += ["--fleet", fleet] if fleet else ["--engines", ",".join(self.engines)]
        for engineId, url in backends:
            argv += ["--backend", f"{engineId}={url}"]
        argv += list(extra)
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.command = [twistd, "--reactor=nvpair", "-n", "--pidfile=", "nvpair-proxy", *argv]
        self.environ = dict(os.environ)
        self.environ.pop("NVPAIR_STATE_DIR", None)
        self.environ.pop("NVPAIR_PROXY_OPS_PORT", None)
        if env:
            self.environ.update(env)
        self.logs: list[dict[str, Any]] = []
        self.rawLines: list[bytes] = []  # every stderr line as written (parsed or not)
        self._watchers: list[tuple[Callable[[dict[str, Any]], bool], defer.Deferred[Any]]] = []
        self.proto: _Protocol | None = None
        self.stderr: _StderrReader | None = None

    def url(self, engineId: str) -> str:
        """The base URL of a facade."""
        return f"http://127.0.0.1:{self.ports[engineId]}"

    def _line(self, raw: bytes) -> None:
        self.rawLines.append(raw)
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
        """Spawn the process and wait until every facade is listening on its port (a
        facade that is not fails the test, with what the process said of it)."""
        self.proto = _Protocol(self)
        readEnd, writeEnd = os.pipe()
        os.set_blocking(readEnd, False)
        self.stderr = _StderrReader(readEnd, self, self.proto)
        self.test.addCleanup(self._closeStderr)  # cleanups run last first: after ``stop``
        self.test.addCleanup(self.stop)
        try:
            self.reactor.spawnProcess(
                self.proto,
                self.command[0],
                self.command,
                env=self.environ,
                path=self.stateDir,
                childFDs={0: "w", 1: "r", 2: writeEnd},
            )
        finally:
            os.close(writeEnd)  # the child holds its copy: EOF comes when the child exits
        self.reactor.addReader(self.stderr)
        try:
            for engineId in self.engines:
                record = await self.waitForLog(facadeReported(engineId))
                if listeningPort(record) != self.ports[engineId]:
                    said = [r for r in self.logs if "facade-problem" in repr(r)] + [record]
                    raise self.test.failureException(
                        f"the {engineId} facade is not listening on port "
                        f"{self.ports[engineId]}, its persisted port: {said!r}"
                    )
        finally:
            self._releasePorts()  # listening on them now (or never will)

    def _releasePorts(self) -> None:
        for held in self._held:
            held.release()

    def stop(self) -> defer.Deferred[Any]:
        """SIGTERM, then SIGKILL after 10 s; fires with the exit code."""
        proto = self.proto
        if proto is None or proto.ended.called:
            return defer.succeed(None)
        if self.stderr is not None and not self.stderr.closed:
            self.releaseLog()  # its end of file is part of "ended"
        killer = self.reactor.callLater(10.0, self._signal, "KILL")
        self._signal("TERM")

        def disarm(code: Any) -> Any:
            if killer.active():
                killer.cancel()
            return code

        return proto.ended.addCallback(disarm)

    def signal(self, name: str) -> None:
        """Send the process a signal (``"HUP"``: reload the fleet file)."""
        self._signal(name)

    def holdLog(self) -> None:
        """Stop reading the process's stderr (a broker that stopped draining it)."""
        assert self.stderr is not None
        self.reactor.removeReader(self.stderr)

    def releaseLog(self) -> None:
        """Read the process's stderr again."""
        assert self.stderr is not None
        self.reactor.addReader(self.stderr)

    def _closeStderr(self) -> None:
        """After the test: stop watching the stderr pipe and close it if still open."""
        if self.stderr is not None and not self.stderr.closed:
            self.reactor.removeReader(self.stderr)
            self.stderr.close()

    def _signal(self, name: str) -> None:
        proto = self.proto
        if proto is None or proto.transport is None:
            return
        try:
            proto.transport.signalProcess(name)
        except ProcessExitedAlready:
            pass
