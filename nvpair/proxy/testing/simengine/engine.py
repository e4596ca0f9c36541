"""The simulated engine: slots, a prefix cache and costs behind a real engine's routes.

``SimEngine`` answers the requests its connections (the fake engine's raw HTTP/1.1 server)
hand it: inference routes become ``Run``s that wait for a slot and take simulated time;
state and probe routes are answered at once from the live state; ``/sim/*`` are the
control routes of tests and benchmarks (spec.md, "The simulated engine").
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime
from zope.interface import implementer

from nvpair.proxy.testing.fakeengine.answers import JSON
from nvpair.proxy.testing.fakeengine.connection import (
    EngineConnection,
    EngineFactory,
    IRequestHandler,
)
from nvpair.proxy.testing.simengine import control
from nvpair.proxy.testing.simengine.config import Failure, SimConfig
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.routes import GETS, INFERENCE, answerGet, inference

_NOT_FOUND = b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'


@implementer(IRequestHandler)
class SimEngine:
    """A simulated inference engine (llama.cpp, LM Studio or Ollama dialect).

    ``reactor`` must also provide ``IReactorTime``; tests pass a ``MemoryReactorClock``.
    ``failure`` (live, set by ``/sim/fail``) makes every inference request fail.
    """

    def __init__(self, reactor: IReactorTCP, config: SimConfig) -> None:
        self.reactor = reactor
        self.clock = IReactorTime(reactor)
        self.config = config
        self.core = Core(self.clock, config)
        self.stats = self.core.stats
        self.cache = self.core.cache
        self.slots = self.core.slots
        self.port = 0
        self.url = ""
        self.openConnections = 0
        self._listening: IListeningPort | None = None
        self._connections: set[EngineConnection] = set()
        self._closeWaiters: list[Deferred[None]] = []

    @property
    def failure(self) -> Failure | None:
        """The failure every inference request meets now (``/sim/fail``), or None."""
        return self.core.failure

    @failure.setter
    def failure(self, failure: Failure | None) -> None:
        self.core.failure = failure

    # -- lifecycle --

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Start listening and return the bound port."""
        self._listening = self.reactor.listenTCP(
            port, EngineFactory(self, self.clock), interface=interface
        )
        address = self._listening.getHost()
        if not isinstance(address, IPv4Address | IPv6Address):
            raise TypeError(f"not a TCP address: {address!r}")
        self.port = address.port
        self.url = f"http://{interface}:{self.port}"
        return self.port

    def close(self) -> Deferred[None]:
        """Stop listening and abort every open connection; fires when all are gone."""
        listening, self._listening = self._listening, None
        waits: list[Deferred[None]] = []
        if listening is not None:
            stopped = listening.stopListening()
            waits.append(succeed(None) if stopped is None else stopped)
        if self._connections:
            d: Deferred[None] = Deferred()
            self._closeWaiters.append(d)
            waits.append(d)
            for connection in list(self._connections):
                connection.abort()
        return DeferredList(waits, fireOnOneErrback=True, consumeErrors=True).addCallback(
            lambda _: None
        )

    # -- IRequestHandler --

    def connectionOpened(self, connection: EngineConnection) -> None:
        """Count the new connection."""
        self._connections.add(connection)
        self.openConnections += 1

    def connectionClosed(self, connection: EngineConnection) -> None:
        """A client went away: its request (running or queued) gives up its slot."""
        self._connections.discard(connection)
        self.openConnections -= 1
        run = self.core.runs.pop(connection, None)
        if run is not None:
            run.cancel()
        if not self._connections:
            waiters, self._closeWaiters = self._closeWaiters, []
            for d in waiters:
                d.callback(None)

    def requestReceived(
        self,
        connection: EngineConnection,
        method: bytes,
        target: bytes,
        headers: dict[str, list[str]],
        body: bytes,
    ) -> None:
        """Route one request: inference, state, probe or control."""
        path, _, query = target.partition(b"?")
        dialect = self.config.dialect
        if method == b"POST" and path in INFERENCE[dialect]:
            self.stats.requests += 1
            inference(self.core, connection, INFERENCE[dialect][path], body)
        elif method == b"GET" and (path in GETS[dialect] or path in GETS["*"]):
            answerGet(self.core, connection, path, query)
        elif path.startswith(b"/sim/") or path == b"/tokenize":
            control.answer(self.core, connection, method, path, body)
        else:
            self.core.responder.sendDocument(connection, 404, None, _NOT_FOUND, JSON)
