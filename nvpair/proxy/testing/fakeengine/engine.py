"""The fake engine: listens, records the requests, and answers each by its script."""

from __future__ import annotations

import json
from collections.abc import Sequence

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTCP
from zope.interface import implementer

from nvpair.proxy.testing.fakeengine.answers import JSON, Responder
from nvpair.proxy.testing.fakeengine.behaviours import Answer, Behaviour, Echo, Recorded
from nvpair.proxy.testing.fakeengine.connection import EngineConnection, IRequestHandler
from nvpair.proxy.testing.fakeengine.dialects import (
    LISTS,
    OLLAMA_STREAMS,
    ROUTES,
    STREAMABLE,
    Listing,
    Route,
)
from nvpair.proxy.testing.fakeengine.server import EngineServer

_NO_MODEL = b'{"error":"fake engine: body must be a JSON object with a model"}'
# The engine-state probes standalone mode polls (spec §11.2): a fake engine has none of
# them, as a server started without them; it answers 404 without recording the probe or
# consuming a scripted behaviour, so polls never race a test's script or its counts.
STATE_PROBES = frozenset((b"/slots", b"/metrics", b"/api/ps", b"/api/v1/models"))
_NO_STATE = b'{"error":"fake engine: no state endpoint"}'


@implementer(IRequestHandler)
class FakeEngine(EngineServer):
    """A scriptable fake inference engine speaking the Ollama or OpenAI-style dialect.

    ``reactor`` must also provide ``IReactorTime`` (for delays); any reactor does, and so
    does ``MemoryReactorClock``.

    Scripting: ``script(...)`` queues behaviours for the next inference requests, ``default``
    answers when the queue is empty, ``listBehaviour`` replaces the model list answer (an
    ``Answer`` or ``Echo`` there means the normal list). ``models`` is the live model list.
    Observing: ``requests`` (when ``record``), ``waitForRequest(n)``, ``requestCount``,
    ``openConnections``.  ``GET`` of an engine-state probe (``STATE_PROBES``) is answered
    404 and neither recorded nor counted.

    Extending: a subclass may override ``requestReceived`` (say, to script each request from
    its headers) and call up; ``routes`` and ``lists`` tell what the dialect serves, ``clock``
    schedules.
    """

    def __init__(
        self,
        reactor: IReactorTCP,
        dialect: str = "openai",
        models: Sequence[str] = ("m1",),
        name: str = "engine",
        record: bool = True,
    ) -> None:
        if dialect not in ROUTES:
            raise ValueError(f"dialect must be 'openai' or 'ollama', not {dialect!r}")
        super().__init__(reactor)
        self.dialect = dialect
        self.models: list[str] = list(models)
        self.name = name
        self.record = record
        self.behaviours: list[Behaviour] = []
        self.default: Behaviour = Answer()
        self.listBehaviour: Behaviour | None = None
        self.requests: list[Recorded] = []
        self.requestCount = 0
        self.routes: dict[bytes, Route] = ROUTES[dialect]
        """POST path -> the inference route it asks for, in this dialect."""
        self.lists: dict[bytes, Listing] = LISTS[dialect]
        """GET path -> the model list it answers, in this dialect."""
        self._responder = Responder(name)
        self._waiters: dict[int, list[Deferred[Recorded]]] = {}

    @property
    def corsHeaders(self) -> dict[str, str]:
        """Headers added to every answer (CORS headers, typically); OPTIONS answers 204."""
        return self._responder.corsHeaders

    @corsHeaders.setter
    def corsHeaders(self, headers: dict[str, str]) -> None:
        self._responder.corsHeaders = headers

    def script(self, *behaviours: Behaviour) -> None:
        """Append behaviours for the next requests."""
        self.behaviours.extend(behaviours)

    def waitForRequest(self, n: int) -> Deferred[Recorded]:
        """Return a Deferred firing with the n-th (1-based) recorded request once it arrives."""
        if len(self.requests) >= n:
            return succeed(self.requests[n - 1])
        d: Deferred[Recorded] = Deferred()
        self._waiters.setdefault(n, []).append(d)
        return d

    # -- IRequestHandler: called by the engine's connections --

    def requestReceived(
        self,
        connection: EngineConnection,
        method: bytes,
        target: bytes,
        headers: dict[str, list[str]],
        body: bytes,
    ) -> None:
        """Record the request, pick its behaviour and route, and answer."""
        if method == b"GET" and target.split(b"?", 1)[0] in STATE_PROBES:
            self._responder.sendDocument(connection, 404, None, _NO_STATE, JSON)
            return
        self.requestCount += 1
        rec = Recorded(method.decode("latin-1"), target.decode("latin-1"), headers, body)
        if self.record:
            connection.notifyLost(rec.connectionLost)
            self.requests.append(rec)
            for d in self._waiters.pop(len(self.requests), ()):
                d.callback(rec)
        responder = self._responder
        path = target.split(b"?", 1)[0]
        if method == b"OPTIONS":
            responder.sendDocument(connection, 204, None, None, None)
            return
        listing = self.lists.get(path) if method == b"GET" else None
        if listing is not None:
            behaviour = self.listBehaviour
            if behaviour is None or isinstance(behaviour, Answer | Echo):
                responder.sendList(connection, listing, self.models)
                return
            responder.apply(connection, behaviour, Route.OTHER, rec, "", False, 1)
            return
        behaviour = self.behaviours.pop(0) if self.behaviours else self.default
        route = self.routes.get(path, Route.OTHER) if method == b"POST" else Route.OTHER
        model = ""
        stream = False
        inputs = 1
        if route is not Route.OTHER:
            try:
                doc: object = json.loads(body)
            except ValueError:
                doc = None
            found = doc.get("model") if isinstance(doc, dict) else None
            if isinstance(doc, dict) and isinstance(found, str):
                model = found
                if route in STREAMABLE:
                    s = doc.get("stream")
                    stream = s is not False if route in OLLAMA_STREAMS else s is True
                elif route is Route.OLLAMA_EMBED or route is Route.EMBEDDING:
                    inp = doc.get("input")
                    inputs = len(inp) if isinstance(inp, list) else 1
                elif route is Route.RERANK:
                    docs = doc.get("documents")
                    inputs = len(docs) if isinstance(docs, list) else 1
            elif isinstance(behaviour, Answer):
                responder.sendDocument(connection, 400, None, _NO_MODEL, JSON)
                return
            else:
                route = Route.OTHER
        responder.apply(connection, behaviour, route, rec, model, stream, inputs)
