"""The simulated engine: slots, a prefix cache and costs behind a real engine's routes.

``SimEngine`` answers the requests its connections (the fake engine's raw HTTP/1.1 server)
hand it: inference routes become ``Run``s that wait for a slot and take simulated time;
state and probe routes are answered at once from the live state; ``/sim/*`` are the
control routes of tests and benchmarks (spec.md, "The simulated engine").
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTCP
from zope.interface import implementer

from nvpair.proxy.testing.fakeengine.answers import JSON
from nvpair.proxy.testing.fakeengine.connection import EngineConnection, IRequestHandler
from nvpair.proxy.testing.fakeengine.server import EngineServer
from nvpair.proxy.testing.simengine import control
from nvpair.proxy.testing.simengine.agents import serve as agents
from nvpair.proxy.testing.simengine.config import Failure, SimConfig
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.residency import routes as residency
from nvpair.proxy.testing.simengine.routes import GETS, INFERENCE, answerGet, inference

_NOT_FOUND = b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'


@implementer(IRequestHandler)
class SimEngine(EngineServer):
    """A simulated inference engine (llama.cpp, LM Studio or Ollama dialect).

    ``reactor`` must also provide ``IReactorTime``; tests pass a ``MemoryReactorClock``.
    ``failure`` (live, set by ``/sim/fail``) makes every inference request fail.
    """

    def __init__(self, reactor: IReactorTCP, config: SimConfig) -> None:
        super().__init__(reactor)
        self.config = config
        self.core = Core(self.clock, config)
        self.stats = self.core.stats
        self.cache = self.core.cache
        self.slots = self.core.slots

    @property
    def failure(self) -> Failure | None:
        """The failure every inference request meets now (``/sim/fail``), or None."""
        return self.core.failure

    @failure.setter
    def failure(self, failure: Failure | None) -> None:
        self.core.failure = failure

    # -- IRequestHandler --

    def connectionClosed(self, connection: EngineConnection) -> None:
        """A client went away: its request (running or queued) gives up its slot."""
        run = self.core.runs.pop(connection, None)
        if run is not None:
            run.cancel()
        super().connectionClosed(connection)

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
        if residency.answer(self.core, connection, method, path, query, body):
            return  # managing models (or a router refusing the request)
        if method == b"POST" and path in INFERENCE[dialect]:
            self.stats.requests += 1
            inference(self.core, connection, INFERENCE[dialect][path], body)
        elif method == b"POST" and path in agents.ROUTES[dialect]:
            agents.answer(self.core, connection, agents.ROUTES[dialect][path], body)
        elif method == b"GET" and (path in GETS[dialect] or path in GETS["*"]):
            answerGet(self.core, connection, path, query)
        elif path.startswith(b"/sim/") or path == b"/tokenize":
            control.answer(self.core, connection, method, path, body)
        else:
            self.core.responder.sendDocument(connection, 404, None, _NOT_FOUND, JSON)
