"""Fleet-wide views (protocol §11, §12): merged model lists and multi-target preflights.

Both ask every node of the facade's snapshot at once, each bounded by the dial timeout
plus ``NODE_GRACE`` seconds, and answer from whatever came back: a node that fails at the
transport or times out is left out.  Neither takes a reservation or creates a workload.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from enum import Enum
from typing import cast

import attrs
from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import Interface, implementer

from nvpair.proxy.dispatch.relay import abortClient
from nvpair.proxy.dispatch.upstream import addressesFor
from nvpair.proxy.engines import Engine
from nvpair.proxy.facade import inventory
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.interfaces import IRequestContext, IUpstream
from nvpair.proxy.routing import cors
from nvpair.proxy.routing.candidates import orderCandidates
from nvpair.proxy.routing.nodes import Node

NODE_GRACE = 10.0
MAX_LIST_BYTES = 8 * 1024 * 1024

# Request headers never sent with a fleet list: the merge must read plain JSON.
_LIST_DROP = frozenset((b"accept-encoding",))


class NoAddress(Exception):
    """A node with nothing to dial (a self node while no local backend is known)."""


class BodyTooLarge(Exception):
    """A node's answer was larger than the fleet views buffer."""


@attrs.frozen
class NodeAnswer:
    """One node's complete answer: status, ``access-control-*`` headers (lowercase), body."""

    node: Node
    status: int
    cors: Mapping[str, str]
    body: bytes


class BodyState(Enum):
    """How a buffered body is doing."""

    COLLECTING = "collecting"
    OVERSIZE = "oversize"
    """Past the cap: what came is dropped, the rest is not read, the answer is an error."""


class _Collector(Protocol):
    """Buffers a response body up to a cap; fires ``done`` with it."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._parts: list[bytes] = []
        self._size = 0
        self.state = BodyState.COLLECTING
        self.done: defer.Deferred[bytes] = defer.Deferred(self._cancel)

    def _stop(self) -> None:
        # A response body's transport is its connection's producer (``IResponse``).
        producer = cast("IPushProducer | None", self.transport)
        if producer is not None:
            producer.stopProducing()

    def _cancel(self, _: object) -> None:
        self._stop()

    def dataReceived(self, data: bytes) -> None:
        if self.state is BodyState.OVERSIZE:
            return
        self._size += len(data)
        if self._size > self._cap:
            self.state = BodyState.OVERSIZE
            self._parts = []
            self._stop()
            return
        self._parts.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.done.called:
            return
        if self.state is BodyState.OVERSIZE:
            self.done.errback(BodyTooLarge(f"answer over {self._cap} bytes"))
        elif isinstance(reason.value, ResponseDone | PotentialDataLoss):
            self.done.callback(b"".join(self._parts))
        else:
            self.done.errback(reason)


def collect(response: IResponse, cap: int = MAX_LIST_BYTES) -> defer.Deferred[bytes]:
    """The whole body of ``response`` (at most ``cap`` bytes); cancelling stops the read."""
    collector = _Collector(cap)
    response.deliverBody(collector)
    return collector.done


def lowerHeaders(headers: Headers, prefix: bytes = b"") -> dict[str, str]:
    """Headers whose lowercase name starts with ``prefix``: lowercase names, repeats joined."""
    out: dict[str, str] = {}
    for name, values in headers.getAllRawHeaders():
        lower = name.lower()
        if lower.startswith(prefix):
            out[lower.decode("latin-1")] = ", ".join(v.decode("latin-1") for v in values)
    return out


def corsHeaders(headers: Headers) -> dict[str, str]:
    """The ``access-control-*`` headers of a response."""
    return lowerHeaders(headers, b"access-control-")


async def _askNode(
    upstream: IUpstream,
    node: Node,
    addresses: Sequence[str],
    method: bytes,
    paths: Sequence[bytes],
    headers: Headers,
) -> NodeAnswer:
    """One request to ``node``: its addresses tried in order until one connects, and its
    paths in order while the node answers 404."""
    for index, address in enumerate(addresses):
        for position, path in enumerate(paths):
            try:
                response = await upstream.request(node, address, method, path, headers, b"")
            except ConnectError:
                break
            body = await collect(response)
            if response.code == 404 and position + 1 < len(paths):
                continue
            return NodeAnswer(node, response.code, corsHeaders(response.headers), body)
        else:
            continue
        if index + 1 < len(addresses):
            continue
        raise ConnectError(f"node {node.id}: no address connected")
    raise NoAddress(f"node {node.id} has no address to try")


def askNode(
    upstream: IUpstream,
    clock: IReactorTime,
    timeout: float,
    node: Node,
    addresses: Sequence[str],
    method: bytes,
    paths: Sequence[bytes],
    headers: Headers,
) -> defer.Deferred[NodeAnswer]:
    """Ask one node, giving up (cancelling the exchange) after ``timeout`` seconds."""
    d = defer.Deferred.fromCoroutine(_askNode(upstream, node, addresses, method, paths, headers))
    return d.addTimeout(timeout, clock)


class ViewState(Enum):
    """Whether a fleet view still has someone to answer."""

    ASKING = "asking"
    GONE = "gone"
    """The client left or the process is stopping: nothing more is written."""


class _View:
    """One fleet view in flight: the client's request and the work answering it."""

    def __init__(self, request: IServerRequest, engine: Engine) -> None:
        self.request = request
        self.engine = engine
        self.state = ViewState.ASKING
        self.running: defer.Deferred[None] | None = None

    @property
    def gone(self) -> bool:
        return self.state is ViewState.GONE

    def end(self) -> None:
        """The client left: stop asking the fleet, write nothing more."""
        self.state = ViewState.GONE
        if self.running is not None and not self.running.called:
            self.running.cancel()

    def shutdown(self) -> None:
        """The process is stopping: cut the client off and stop asking."""
        if self.state is not ViewState.GONE:
            self.state = ViewState.GONE
            abortClient(self.request)
        self.end()


class IFleetViews(Interface):
    """The fleet-wide answers a front door hands requests to."""

    def modelList(facade: Facade, request: IServerRequest) -> None:
        """Answer a fleet model list route (protocol §11, §12)."""

    def preflight(facade: Facade, request: IServerRequest) -> None:
        """Answer a multi-target CORS preflight (protocol §12)."""


@implementer(IFleetViews)
class Fleet:
    """Answers fleet model lists and preflights for a facade."""

    log = Logger()

    def __init__(self, context: IRequestContext) -> None:
        self.context = context

    # -- asking the fleet -----------------------------------------------------------------

    def _nodes(self, facade: Facade) -> list[Node]:
        """Every reachable node of the snapshot, in candidate order (pin, scheduler, default)."""
        snapshot = facade.snapshot
        nodes = tuple(n for n in snapshot.nodes if not n.isSelf or facade.hasLocalBackend)
        ordered, _ = orderCandidates(nodes, facade.pin, self.context.reservations.rank)
        return list(ordered)

    async def _askAll(
        self, facade: Facade, method: bytes, paths: Sequence[bytes], headers: Headers
    ) -> list[NodeAnswer | None]:
        """Ask every node at once; ``None`` for a node that failed or timed out."""
        context = self.context
        timeout = context.settings.dialTimeout + NODE_GRACE
        asks: list[defer.Deferred[NodeAnswer | None]] = []
        for node in self._nodes(facade):
            addresses = addressesFor(node, facade.localBackend, facade.confirmed.get(node.id))
            d = askNode(
                context.upstream, context.clock, timeout, node, addresses, method, paths, headers
            )
            asks.append(d.addErrback(self._nodeFailed, facade, node))
        return list(await defer.gatherResults(asks))

    def _nodeFailed(self, failure: Failure, facade: Facade, node: Node) -> None:
        if self.context.logControl.enabled("debug"):
            self.log.debug(
                "fleet-node-skipped",
                engine=facade.engine.id,
                node=node.id,
                problem=type(failure.value).__name__,
            )
        return None

    def _run(
        self,
        request: IServerRequest,
        engine: Engine,
        work: Callable[[_View], Coroutine[defer.Deferred[object], object, None]],
    ) -> None:
        """Run ``work`` for ``request``; a client that leaves, or the process stopping, ends it."""
        view = _View(request, engine)
        exchanges = self.context.exchanges
        exchanges.add(view)
        request.notifyFinish().addErrback(lambda _: view.end())
        view.running = defer.Deferred.fromCoroutine(work(view))
        view.running.addErrback(self._crashed, view)
        view.running.addBoth(lambda _: exchanges.discard(view))

    def _crashed(self, failure: Failure, view: _View) -> None:
        if isinstance(failure.value, defer.CancelledError):
            return
        self.log.failure("fleet-view-crashed", failure)
        self.context.reportInternal(type(failure.value).__name__)
        request = view.request
        if not view.gone and not request.finished and not request.startedWriting:
            self.context.sendError(request, view.engine, 500, "internal", "internal proxy error")

    # -- fleet model lists ----------------------------------------------------------------

    def modelList(self, facade: Facade, request: IServerRequest) -> None:
        """Answer a fleet model list route (protocol §11, §12)."""
        self._run(request, facade.engine, lambda view: self._modelList(facade, view))

    async def _modelList(self, facade: Facade, view: _View) -> None:
        request = view.request
        engine = view.engine
        headers = self.context.forwardHeaders(request.requestHeaders)
        for name in _LIST_DROP:
            headers.removeHeader(name)
        query = request.uri[len(request.path) :]
        paths = [p + query for p in engine.listPaths(request.path)]
        answers = await self._askAll(facade, b"GET", paths, headers)
        if view.gone:
            return
        responders = [a for a in answers if a is not None and a.status < 500]
        listed = [a for a in responders if 200 <= a.status < 300]
        origin = _header(request, b"origin")
        granted: dict[str, str] = {}
        if origin is not None:
            verdict = cors.listCors(origin, [a.cors for a in responders])
            if verdict is None:
                self.context.sendError(
                    request,
                    engine,
                    403,
                    "origin_denied",
                    "a node of the fleet does not allow this origin",
                )
                return
            granted = verdict
        path = request.path.decode("latin-1")
        try:
            body = inventory.mergeLists(path, [a.body for a in listed])
        except inventory.InvalidList as e:
            self.log.warn("fleet-list-invalid", engine=engine.id, problem=str(e))
            kept = cors.invalidListCors(origin, [a.cors for a in responders]) if origin else {}
            self._send(
                request,
                502,
                engine.errorBody(
                    request.path, "invalid_inventory", "a node answered an invalid model list"
                ),
                kept,
            )
            return
        if self.context.logControl.enabled("debug"):
            self.log.debug("fleet-list", engine=engine.id, asked=len(answers), merged=len(listed))
        self._send(request, 200, body, granted)

    def _send(
        self, request: IServerRequest, status: int, body: bytes, extra: Mapping[str, str]
    ) -> None:
        request.setResponseCode(status)
        headers = request.responseHeaders
        headers.setRawHeaders(b"content-type", [b"application/json"])
        headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
        for name, value in extra.items():
            headers.setRawHeaders(name.encode("latin-1"), [value.encode("latin-1")])
        request.write(body)
        request.finish()

    # -- preflights -----------------------------------------------------------------------

    def preflight(self, facade: Facade, request: IServerRequest) -> None:
        """Answer a multi-target CORS preflight (protocol §12)."""
        self._run(request, facade.engine, lambda view: self._preflight(facade, view))

    async def _preflight(self, facade: Facade, view: _View) -> None:
        request = view.request
        asked = cors.preflightHeaders(lowerHeaders(request.requestHeaders))
        headers = Headers()
        for name, value in asked.items():
            headers.setRawHeaders(name.encode("latin-1"), [value.encode("latin-1")])
        answers = await self._askAll(facade, b"OPTIONS", [request.uri], headers)
        if view.gone:
            return
        responders = [a.cors for a in answers if a is not None and a.status < 500]
        if not responders:
            self.context.sendError(
                request,
                facade.engine,
                502,
                "upstream_unreachable",
                "no node of the fleet answered the preflight",
            )
            return
        granted = cors.preflightAnswer(asked["origin"], responders)
        request.setResponseCode(204)
        out = request.responseHeaders
        for name, value in granted.items():
            out.setRawHeaders(name.encode("latin-1"), [value.encode("latin-1")])
        request.finish()


def _header(request: IServerRequest, name: bytes) -> str | None:
    value = request.getHeader(name)
    return None if value is None else str(value.decode("latin-1"))
