"""Requests from pinned cluster peers (spec §7, protocol §6): straight to the local backend.

The node that sent a peer request has already routed it, so here it is never routed
onward, takes no reservation and is no workload: it is forwarded verbatim to the facade's
local backend, and the answer is passed through as soon as its headers arrive, its body
streamed with the upstream transport registered as the client's producer (backpressure).
The peer's pin (and this node's own certificate) is checked again on every request, so a
pin removed from ``pins.json`` or a rotated certificate cuts even a kept-alive connection.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol as Structural

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.dispatch.attempt import discard
from nvpair.proxy.dispatch.relay import ClientFlow, abortClient, copyResponseHeaders, forwardHeaders
from nvpair.proxy.engines import Engine
from nvpair.proxy.http.interfaces import IDoor, IServerRequest
from nvpair.proxy.interfaces import IPeerTrust, IRequestContext
from nvpair.proxy.tracing.interfaces import IPeerTrace, TraceStart


def peerTransport(request: IServerRequest) -> object:
    """The transport of a request's connection (the TLS protocol on the cluster personality)."""
    channel = request.channel
    return None if channel is None else channel.transport


class PeerFacade(Structural):
    """What a peer door reads of its facade (``facade.Facade``): its engine and backend.

    Structural (a ``typing.Protocol``), so the facade qualifies as it is, without the facade
    package importing the cluster package."""

    @property
    def engine(self) -> Engine: ...

    @property
    def localBackend(self) -> str | None: ...


@implementer(IDoor)
class PeerDoor:
    """Serves a pinned peer's request from the facade's local backend, never routing onward."""

    log = Logger()

    def __init__(self, context: IRequestContext, facade: PeerFacade) -> None:
        self.context = context
        self.facade = facade

    def handle(self, request: IServerRequest) -> None:
        """Re-check the pin and our certificate, then forward to the local backend (or 502)."""
        trust: IPeerTrust | None = self.context.trust
        transport = peerTransport(request)
        peer = None if trust is None else trust.peerNodeId(transport)
        if trust is None or peer is None or not trust.presentsCurrentIdentity(transport):
            abortClient(request)
            return
        engine = self.facade.engine
        if request.tooLarge:
            request.setHeader(b"connection", b"close")
            self.context.sendError(
                request,
                engine,
                413,
                "body_too_large",
                "the request body is larger than the proxy accepts",
            )
            return
        backend = self.facade.localBackend
        if backend is None:
            self.context.sendError(request, engine, 502, "upstream_unreachable", "no local backend")
            return
        PeerForward(self.context, engine, request, backend, peer).start()

    def crashed(self, request: IServerRequest, error: Exception) -> None:
        """An unexpected exception: report it (type only) and answer 500 if nothing was sent."""
        self.log.failure("peer-request-crashed", engine=self.facade.engine.id)
        self.context.reportInternal(type(error).__name__)
        if not request.finished and not request.startedWriting:
            try:
                self.context.sendError(
                    request, self.facade.engine, 500, "internal", "internal proxy error"
                )
            except Exception:  # noqa: BLE001 - the connection may already be gone
                abortClient(request)


class _PeerBody(Protocol):
    """Receives the local engine's response body and hands it to the forward."""

    def __init__(self, forward: PeerForward) -> None:
        self.forward = forward

    def connectionMade(self) -> None:
        self.forward.bodyStarted(self.transport)  # type: ignore[arg-type]

    def dataReceived(self, data: bytes) -> None:
        self.forward.bodyData(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.forward.bodyEnded(reason)


class Phase(Enum):
    """Where a peer forward is: waiting for the backend's headers, relaying, or over."""

    WAITING = "waiting"
    RELAYING = "relaying"
    ENDED = "ended"


class PeerForward:
    """One peer request relayed to the local backend: headers at once, body streamed.

    ``clientGone`` is orthogonal to the phase: the peer may leave in any phase, and the
    forward still ends exactly once (leaving the context's set of exchanges).
    """

    log = Logger()

    def __init__(
        self,
        context: IRequestContext,
        engine: Engine,
        request: IServerRequest,
        backend: str,
        peer: str,
    ) -> None:
        self.context = context
        self.engine = engine
        self.request = request
        self.backend = backend
        self.peer = peer
        self.clientGone = False
        self.phase = Phase.WAITING
        self._pending: defer.Deferred[IResponse] | None = None
        self._body: IPushProducer | None = None
        self._flow: ClientFlow | None = None
        self.status: int | None = None
        self.trace: IPeerTrace | None = None  # its spans, with --otel on

    def start(self) -> None:
        """Send the request to the local backend."""
        request = self.request
        self.context.exchanges.add(self)
        request.notifyFinish().addErrback(self._clientLost)
        body = request.content.getvalue() if request.content is not None else b""
        headers = forwardHeaders(request.requestHeaders)
        tracer = self.context.tracer
        if tracer is not None:
            begin = TraceStart(request.method, request.path, request.requestHeaders, self.engine.id)
            self.trace = tracer.peerStarted(begin, headers, self.peer, self.backend)
        d = self.context.upstream.request(
            None, self.backend, request.method, request.uri, headers, body
        )
        self._pending = d
        d.addCallbacks(self._gotResponse, self._failed)

    def _failed(self, failure: Failure) -> None:
        self._pending = None
        if self.clientGone:
            self._end("cancelled")
            return
        if self.context.logControl.enabled("debug"):
            self.log.debug(
                "peer-backend-failed",
                engine=self.engine.id,
                peer=self.peer,
                problem=failure.type.__name__ if failure.type else "unknown",
            )
        self._end("transport")
        self.context.sendError(
            self.request,
            self.engine,
            502,
            "upstream_unreachable",
            "the local backend failed at the transport",
        )

    def _gotResponse(self, response: IResponse) -> None:
        self._pending = None
        if self.clientGone:
            discard(response, self.context.clock, 0)
            self._end("cancelled")
            return
        self.status = response.code
        self.phase = Phase.RELAYING
        request = self.request
        request.setResponseCode(response.code, response.phrase)
        length = None if response.length is UNKNOWN_LENGTH else int(response.length)
        copyResponseHeaders(response.headers, request.responseHeaders, length)
        request.write(b"")  # the headers go out now: the routing node's gate waits for the body
        response.deliverBody(_PeerBody(self))

    def bodyStarted(self, transport: IPushProducer) -> None:
        """The body is about to flow: register the upstream as the client's producer."""
        self._body = transport
        if self.clientGone:
            transport.stopProducing()
            return
        flow = self._flow = ClientFlow(
            transport,
            self.context.clock,
            self.context.settings.clientWriteTimeout,
            self._deadClient,
        )
        self.request.registerProducer(flow, True)

    def bodyData(self, data: bytes) -> None:
        """Forward one chunk exactly as received."""
        if not self.clientGone:
            self.request.write(data)

    def bodyEnded(self, reason: Failure) -> None:
        """The body ended: finish the client's response, or cut it when truncated."""
        if self._flow is not None:
            self._flow.cancel()
        clean = isinstance(reason.value, ResponseDone | PotentialDataLoss)
        if self.clientGone:
            self._end("cancelled")
            return
        self._end("completed" if clean else "truncated")
        request = self.request
        request.unregisterProducer()
        if clean:
            request.finish()
        else:
            abortClient(request)

    def _deadClient(self) -> None:
        """The peer stopped reading for longer than the write deadline."""
        abortClient(self.request)

    def _clientLost(self, _: object) -> None:
        self.clientGone = True
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.cancel()
        if self._body is not None:
            self._body.stopProducing()
        if self._flow is not None:
            self._flow.cancel()

    def shutdown(self) -> None:
        """The process is stopping: cut the peer's connection (which stops the upstream)."""
        if not self.clientGone:
            abortClient(self.request)

    def _end(self, outcome: str) -> None:
        if self.phase is not Phase.ENDED:
            self.phase = Phase.ENDED
            self.context.exchanges.discard(self)
            if self.trace is not None:
                self.trace.ended(self.status, outcome)
