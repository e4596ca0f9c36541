"""Integration-test fixtures: the real proxy process driven through the supervisor client.

``ProxyFixture`` spawns ``twistd -n --pidfile= nvpair-proxy`` exactly as the broker does,
records every notification and log line, and stops the process in the test's cleanup.
``startEngine`` runs a ``FakeEngine`` on 127.0.0.1 and closes it in cleanup.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import FakeEngine
from nvpair.supervisor.process import ProxyProcess

CANARY = "CANARY-7f3a9e-SECRET"


def freePort() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (anything may take it since:
    a child that must listen on it is better given a ``PortReservation``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortReservation:
    """A TCP port held for a child process to listen on, until ``release``.

    The port is bound on every address (``::`` dual-stack, or ``0.0.0.0`` without IPv6)
    with ``SO_REUSEADDR`` and never listened on.  Meanwhile no other socket's bind to
    port 0 (a concurrent test's engine, another fixture's reservation) and no outgoing
    connection is given it, yet a listener that sets ``SO_REUSEADDR`` (every Twisted
    ``listenTCP``, the proxy's facades among them) can bind it: Linux lets two such sockets
    share a port when the one already there does not listen.  A connection to the port
    before the child listens is refused.  Release it once the child listens.
    """

    def __init__(self) -> None:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if sock.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(("::", 0))
            else:
                sock.bind(("0.0.0.0", 0))
        except BaseException:
            sock.close()
            raise
        self._socket: socket.socket | None = sock
        self.port = int(sock.getsockname()[1])

    def release(self) -> None:
        """Give the port up (once)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def reservedPort(test: Any) -> int:
    """A port for a child that listens with ``SO_REUSEADDR`` (the proxy's ops listener,
    facades and aliases), held as ``PortReservation`` says until ``test`` cleans up: a
    concurrent worker's connection or listener cannot take it before the child binds, nor
    while a restarted child binds it again.  ``test`` is anything with ``addCleanup``."""
    held = PortReservation()
    test.addCleanup(held.release)
    return held.port


def startEngine(
    test: TestCase,
    reactor: Any,
    dialect: str = "openai",
    models: Sequence[str] = ("m1",),
    name: str = "engine",
) -> FakeEngine:
    """A fake engine listening on 127.0.0.1, closed when the test ends."""
    engine = FakeEngine(reactor, dialect=dialect, models=models, name=name)
    engine.listen(0)
    test.addCleanup(engine.close)
    return engine


class ProxyFixture:
    """One real proxy process under a scripted broker."""

    def __init__(
        self,
        test: TestCase,
        reactor: Any,
        argv: Sequence[str] = (),
        stateDir: str | None = None,
        env: dict[str, str] | None = None,
        restartPolicy: Callable[[int], float] | None = None,
    ) -> None:
        self.test = test
        self.reactor = reactor
        self.stateDir = stateDir or tempfile.mkdtemp(prefix="nvpair-state-")
        self.workDir = tempfile.mkdtemp(prefix="nvpair-cwd-")
        self.notifications: list[tuple[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.protocolErrors: list[str] = []
        self.crashes: list[Any] = []
        environ = dict(os.environ)
        environ.pop("NVPAIR_STATE_DIR", None)
        if env:
            environ.update(env)
        self.process = ProxyProcess(
            reactor,
            ["--state-dir", self.stateDir, *argv],
            environ,
            path=self.workDir,
            onLog=self._logged,
            onProtocolError=self.protocolErrors.append,
            requestTimeout=20.0,
            restartPolicy=restartPolicy,
            onCrash=self.crashes.append,
        )
        self.logWaiters: list[defer.Deferred[None]] = []
        self.process.subscribe(lambda method: True, self._notified)

    def _logged(self, record: dict[str, Any]) -> None:
        self.logs.append(record)
        waiters, self.logWaiters = self.logWaiters, []
        for waiter in waiters:
            waiter.callback(None)

    async def someLogs(self, timeout: float = 20.0) -> list[dict[str, Any]]:
        """The log records so far, once there is at least one (stderr lines come from the
        proxy's writer thread, so they may trail the stdout messages)."""
        if not self.logs:
            waiter: defer.Deferred[None] = defer.Deferred()
            self.logWaiters.append(waiter)
            await waiter.addTimeout(timeout, self.reactor)
        return self.logs

    def _notified(self, method: str, params: Any) -> None:
        self.notifications.append((method, params))

    def start(self) -> defer.Deferred[None]:
        """Spawn the process; it is stopped (stdin closed) when the test ends."""
        self.test.addCleanup(self.stop)
        return self.process.start()

    def stop(self) -> defer.Deferred[int | None]:
        """Close stdin and wait for the exit (killing after 10 s)."""
        return self.process.stop(10.0)

    def request(self, method: str, params: Any) -> defer.Deferred[Any]:
        """A JSON-RPC request to the proxy."""
        return self.process.request(method, params)

    def notify(self, method: str, params: Any) -> None:
        """A JSON-RPC notification to the proxy."""
        self.process.notify(method, params)

    async def enable(self, engine: str, port: int | None = None, **extra: Any) -> int:
        """Enable a facade on ``port`` (by default one held for it until the proxy answers,
        as ``PortReservation`` says); returns the bound port."""
        held = PortReservation() if port is None else None
        try:
            params = {"engine": engine, "port": port if held is None else held.port, **extra}
            result = await self.process.request("facade/enable", params)
        finally:
            if held is not None:
                held.release()
        assert isinstance(result, dict), result
        return int(result["port"])

    def nodes(self, engine: str, nodes: list[dict[str, Any]]) -> defer.Deferred[Any]:
        """Replace a facade's discovery snapshot; fires once the proxy has applied it."""
        self.notify(f"{engine}:discovery:nodes", {"nodes": nodes})
        return self.sync()

    def sync(self) -> defer.Deferred[Any]:
        """A round trip: every message sent before it has been handled when it fires."""
        return self.process.request("log/set-level", {"level": self.level})

    level = "info"

    def methods(self, prefix: str = "") -> list[str]:
        """The notification methods received so far, optionally filtered by prefix."""
        return [m for m, _ in self.notifications if m.startswith(prefix)]

    def workloadEvents(self, workloadId: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The workload events received so far (for one workload id when given)."""
        out = []
        for method, params in self.notifications:
            if method.startswith("workload:"):
                info = params["workloadInfo"]
                if workloadId is None or info["id"] == workloadId:
                    out.append((method, info))
        return out

    def nextNotification(
        self, method: str, predicate: Callable[[Any], bool] | None = None, timeout: float = 20.0
    ) -> defer.Deferred[Any]:
        """The next notification named ``method`` (matching ``predicate``)."""
        return self.process.nextNotification(method, predicate, timeout)

    async def waitFor(
        self, method: str, predicate: Callable[[Any], bool] | None = None, timeout: float = 20.0
    ) -> Any:
        """A notification already received, or the next one, named ``method``."""
        for m, params in self.notifications:
            if m == method and (predicate is None or predicate(params)):
                return params
        return await self.process.nextNotification(method, predicate, timeout)


def directNode(
    nodeId: str, engine: FakeEngine, models: Sequence[str] | None = None
) -> dict[str, Any]:
    """A discovery node reached directly over plaintext at a fake engine."""
    return {
        "id": nodeId,
        "self": False,
        "addresses": [engine.url],
        "models": list(models if models is not None else engine.models),
    }


class _RawClient(Protocol):
    """Sends bytes on connect and keeps everything that comes back until the server closes."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.received = b""
        self.closed: defer.Deferred[bytes] = defer.Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.payload)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed.callback(self.received)


async def rawExchange(
    port: int, payload: bytes, host: str = "127.0.0.1", timeout: float = 30.0
) -> bytes:
    """Bytes sent over a fresh TCP connection to ``host:port``; everything answered until
    the server closes (connecting bounded at 10 s, the answer at ``timeout``)."""
    client = _RawClient(payload)
    await connectProtocol(TCP4ClientEndpoint(reactor, host, port, timeout=10), client)
    return await client.closed.addTimeout(timeout, reactor)
