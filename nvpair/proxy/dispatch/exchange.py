"""One client request through the fleet (spec §5, §5.1, §5.4): its policy's exchange, the loop
that drives it (``driver``) and the one terminal bookkeeping step however it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.broker.workloads import FAILED
from nvpair.proxy.dispatch.answering import MESSAGES, commitHead
from nvpair.proxy.dispatch.attempt import Attempt
from nvpair.proxy.dispatch.driver import PolicyDriver
from nvpair.proxy.dispatch.ending import finishServed, finishUnserved, pauseFor
from nvpair.proxy.dispatch.interfaces import IAttemptExchange, IFacadeView, IPolicyOwner
from nvpair.proxy.dispatch.outcome import (
    CLIENT_GONE,
    COMPLETE,
    CUT,
    GONE,
    NO_CONTENT,
    OPEN,
    STOPPED,
    TRUNCATED,
    ClientState,
    Committed,
    Failed,
)
from nvpair.proxy.dispatch.reading import meterFor
from nvpair.proxy.dispatch.relay import ClientFlow, abortClient, truncateClient
from nvpair.proxy.dispatch.seat import QueueSeat
from nvpair.proxy.endings import BodyEnding
from nvpair.proxy.engines import RouteClass
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.interfaces import IRequestContext, IUpstream, IWorkload
from nvpair.proxy.placement.interfaces import IOutcome, IPlacementExchange
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.placement.policies import POLICIES
from nvpair.proxy.routing.facts import NO_FACTS, RequestFacts
from nvpair.proxy.routing.reservations import Reservation
from nvpair.proxy.routing.stats import StatsMeter
from nvpair.proxy.tracing.interfaces import IRequestTrace, TraceStart

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node
    from nvpair.proxy.settings import Settings

_NO_HEADERS = Headers()


@implementer(IPlacementExchange, IPolicyOwner, IAttemptExchange)
class Exchange:
    """One client request on its way through the fleet, and everything its ending touches
    (slotted: it lives as long as its stream)."""

    log = Logger()
    __slots__ = (
        *("context", "facade", "engine", "settings", "clock", "upstream", "request", "method"),
        *("uri", "path", "forwardHeaders", "body", "facts", "routeClass", "inference", "model"),
        *("createdAt", "workload", "dispatchedAt", "dispatchedWith", "driver", "seat", "trace"),
        *("prefixKey", "reservation", "activeNode", "attempts", "meter", "flow", "written"),
        *("committedStatus", "committed", "expectedLength", "client", "stopping", "serving"),
        "answered",
    )

    def __init__(
        self,
        context: IRequestContext,
        facade: IFacadeView,
        request: IServerRequest,
        routeClass: RouteClass,
        model: str | None,
        body: bytes,
        facts: RequestFacts = NO_FACTS,
        prefixKey: AffinityKey | None = None,
    ) -> None:
        self.context = context
        self.facade = facade
        self.engine = facade.engine
        self.settings: Settings = context.settings
        self.clock: IReactorTime = context.clock
        self.upstream: IUpstream = context.upstream
        self.request = request
        self.method: bytes = request.method
        self.uri: bytes = request.uri
        self.path: bytes = request.path
        self.forwardHeaders: Headers = context.forwardHeaders(request.requestHeaders)
        self.body = body
        self.facts = facts  # what admission read of the body (never the document)
        self.routeClass = routeClass
        self.inference = routeClass is RouteClass.INFERENCE
        self.model = model
        self.createdAt: float = self.clock.seconds()
        self.workload: IWorkload | None = None
        self.activeNode: str | None = None
        self.attempts = 0
        self.dispatchedAt: float | None = None  # when the latest attempt was dispatched
        self.dispatchedWith = 0  # ours for its model on its node then, itself included
        self.meter: StatsMeter | None = None
        self.flow: ClientFlow | None = None
        self.committedStatus: int | None = None
        self.committed: Committed | None = None  # the attempt that committed, once one did
        self.expectedLength: int | None = None
        self.written = 0
        self.client: ClientState = OPEN
        self.stopping = False  # the process is stopping: the request is cancelled
        self.answered = False
        self.serving: Committed | None = None
        self.driver = PolicyDriver(self)  # the placement loop
        self.seat = QueueSeat(context.queueing, self, request.requestHeaders)
        self.prefixKey = prefixKey  # the prompt's digests, where admission took them
        self.reservation: Reservation | None = None  # this round's, on the node tried
        self.trace: IRequestTrace | None = None  # its spans, with --otel on

    @property
    def clientGone(self) -> bool:
        """Whether the client left (or was cut off) before its answer ended (for metrics)."""
        return self.client is GONE

    @property
    def servedBy(self) -> str | None:
        """The node whose response committed, else the node of the attempt in flight."""
        committed = self.committed
        return committed.node.id if committed is not None else self.activeNode

    @property
    def ending(self) -> BodyEnding | None:
        """How the committed body ended, once it did (None before, or with no commit)."""
        committed = self.committed
        return None if committed is None else committed.ending

    @property
    def halted(self) -> bool:
        """Whether a wait the policy yields is cancelled at once (client gone, stopping)."""
        return self.client is GONE or self.stopping

    def start(self) -> None:
        """Admit (workload ``submitted``) and run the policy for this route class."""
        if self.inference and self.model is not None:
            self.workload = self.context.reporter.admit(self.engine.id, self.model)
        self.context.exchanges.add(self)
        if (tracer := self.context.tracer) is not None:
            begin = TraceStart(
                self.method, self.path, self.request.requestHeaders, self.engine.id,
                self.inference, self.model, self.createdAt,
            )  # fmt: skip
            self.trace = tracer.requestStarted(begin)
        self.request.whenLost(self._clientLost)
        if self.request.disconnected:
            self.client = GONE  # gone before we started: ``whenLost`` will never call
            self._terminal()
            return
        self.driver.start(POLICIES[self.routeClass])

    def placed(self) -> None:
        """The policy ended: serve what committed, or end now if it answered itself."""
        streaming = False
        try:
            committed = self.committed
            if committed is not None:
                streaming = self.serve(committed)
        except Exception as e:
            self._internal(e)
        finally:
            if not streaming:
                self._terminal()

    def interrupted(self, error: BaseException | None) -> None:
        """The placement loop raised ``error`` (reported, answered for) or was cancelled."""
        if error is not None:
            self._internal(error)
        self._terminal()

    def _internal(self, e: BaseException) -> None:
        self.log.failure("request-crashed", engine=self.engine.id, path=self.path.decode("latin-1"))
        self.context.reportInternal(type(e).__name__)
        if self.committedStatus is None:
            self.answerError(500, "internal")
        elif self.client is not GONE:
            abortClient(self.request)
        if self.workload is not None:
            self.workload.finish(FAILED, "internal")

    def _terminal(self) -> None:
        """Release everything the request held; emit its terminal event if nothing did."""
        self.releaseReservation()
        self._setActive(None)
        if self.flow is not None:
            self.flow.cancel()
        self.context.exchanges.discard(self)
        self.seat.ended()
        workload = self.workload
        if workload is not None and not workload.ended:
            finishUnserved(workload, self, self.clock.seconds())
        self.context.requestEnded(self)
        self.body, self.model = b"", None  # not left to the cycle GC (§6)

    def _clientLost(self, _: object) -> None:
        if self.client is not OPEN:
            return  # already handled, or the loss is our own abort of a truncated stream
        self.client = GONE
        self._cancel()

    def _cancel(self) -> None:
        """Cancel the placement loop, or the committed body being served."""
        if self.driver.cancel():
            return
        committed = self.serving
        if committed is not None:
            self.serving = None
            committed.ending = STOPPED
            committed.attempt.stopBody()
            self._terminal()

    def deadClient(self) -> None:
        """The client stopped reading for longer than the write deadline: cut it off."""
        if self.client is GONE:
            return
        abortClient(self.request)
        self._clientLost(None)

    def shutdown(self) -> None:
        """The process is stopping: cancel this request (reported cancelled)."""
        self.stopping = True
        if self.client is not GONE:
            abortClient(self.request)
        self._cancel()

    def _setActive(self, nodeId: str | None) -> None:
        if self.activeNode is not None:
            self.context.activity.change(self.activeNode, -1, self.model)
        self.activeNode = nodeId
        if nodeId is not None:
            context = self.context
            context.activity.change(nodeId, +1, self.model)
            residency, model = context.residency, self.model
            if residency is not None and model is not None:  # slots per model (Ollama)
                self.dispatchedWith = residency.running(nodeId, model)
            else:
                self.dispatchedWith = context.activity.inFlight.get(nodeId, 1)

    # -- what the policy asks for, besides attempts (``IPlacementExchange``) ---------------

    def reserve(self, nodeId: str) -> None:
        """Take this round's reservation on ``nodeId``."""
        self.releaseReservation()
        self.reservation = self.context.reservations.reserve(nodeId)

    def releaseReservation(self) -> None:
        """Release the reservation, if any (before a backoff and at the end)."""
        if self.reservation is not None:
            self.reservation.release()
            self.reservation = None

    def pause(self, seconds: float, wakeOnDiscovery: bool) -> defer.Deferred[None]:
        """Wait ``seconds`` (or until discovery changes, when asked), cancellably."""
        return pauseFor(self.clock, self.facade, seconds, wakeOnDiscovery)

    def retrying(self) -> None:
        """The failed attempt was not the last: the workload is queued again."""
        if self.workload is not None:
            self.workload.submitted(None)

    def unavailable(self, reason: str) -> None:
        """The loop ended between attempts: 503 with Retry-After naming why."""
        self.answerError(503, reason, self.settings.retryAfter)

    def answerFinal(self, outcome: IOutcome) -> None:
        """The final permitted attempt failed uncommitted: it answers for itself."""
        if outcome.kind is NO_CONTENT:
            self.answerError(504, "no_content")
        else:
            self.answerError(502, "upstream_unreachable")

    # -- attempts -------------------------------------------------------------------------

    def attemptOn(self, node: Node, final: bool, gated: bool) -> defer.Deferred[IOutcome]:
        """One attempt on ``node``: move the reservation, report the placement, run it (its
        Deferred, not a coroutine: each coroutine level is resumed on every loop step)."""
        self.attempts += 1
        self.dispatchedAt = self.clock.seconds()
        reservation = self.reservation
        if reservation is not None:
            reservation.moveTo(node.id)
        if self.workload is not None:
            self.workload.submitted(node.id)
        self._setActive(node.id)
        if self.trace is not None:
            self.forwardHeaders = self.trace.attemptStarted(node, self.forwardHeaders)
        return Attempt(self, node, final, gated, self.seat.sameFailure(node)).start()

    def attemptFailed(self, outcome: Failed) -> None:
        """The attempt ended uncommitted (called by it just before its Deferred fires)."""
        self._setActive(None)
        self.seat.attemptFailed(outcome)
        self.context.attemptFailed(self, outcome)

    def serve(self, committed: Committed) -> bool:
        """The response committed: report it running; True while its body streams on."""
        if self.workload is not None:
            self.workload.started(committed.node.id)
        if committed.ending is not None:
            self._served(committed.ending, committed)
            return False
        self.serving = committed
        return True

    def bodyEnded(self, committed: Committed) -> None:
        """The committed body ended (``committed.ending`` says how): report, then end."""
        if self.serving is not committed:
            return  # not handed over yet: ``serve`` sees the ending
        self.serving = None
        try:
            assert committed.ending is not None
            self._served(committed.ending, committed)
        except Exception as e:
            self._internal(e)
        finally:
            self._terminal()

    def _served(self, ending: BodyEnding, committed: Committed) -> None:
        if self.workload is not None:
            now = self.clock.seconds()
            gone = self.client is GONE
            finishServed(self.workload, ending, gone, committed.status, self.meter, now)

    # -- writing the client's answer -------------------------------------------------------

    def writeHead(
        self,
        committed: Committed,
        phrase: bytes,
        headers: Headers,
        length: int | None,
        upstream: IPushProducer,
    ) -> None:
        """Commit: status and headers to the client, upstream registered as its producer."""
        code = self.committedStatus = committed.status
        self.committed = committed
        self.expectedLength = length
        self.answered = True
        request = self.request
        # Committed: no attempt will send the request again, so its copies can go now.
        self.body, self.forwardHeaders = b"", _NO_HEADERS
        content = request.content
        if content is not None:
            content.close()
        nodeId, responses = committed.node.id, self.context.responses
        commitHead(request, code, phrase, headers, length, nodeId, self.attempts)
        if self.inference and code < 400:
            meter = meterFor(self.engine, self.path, code, self.createdAt, responses, nodeId)
            meter.firstByte(self.clock.seconds())
            self.meter = meter
        self.seat.committed(nodeId, code)
        self.context.committed(self, nodeId)
        if self.client is GONE:
            upstream.stopProducing()
            return
        self.flow = ClientFlow(
            upstream, self.clock, self.settings.clientWriteTimeout, self.deadClient
        )
        request.registerProducer(self.flow, True)

    def write(self, data: bytes) -> None:
        """Forward one body chunk, exactly as received."""
        if self.meter is not None:
            self.meter.feed(data)
        if self.client is not GONE:
            self.written += len(data)
            self.request.write(data)

    def endBody(self, clean: bool) -> BodyEnding:
        """The upstream body ended; finish or cut the client's response."""
        if self.flow is not None:
            self.flow.cancel()
        if self.client is GONE:
            return CLIENT_GONE
        request = self.request
        request.unregisterProducer()
        if clean:
            request.finish()
            return COMPLETE
        self.client = CUT
        truncateClient(request, self.clock, self.settings.clientWriteTimeout or 60.0)
        return TRUNCATED

    def answerError(self, status: int, reason: str, retryAfter: int | None = None) -> None:
        """Send a response the proxy generates itself, in the engine's error shape."""
        self.answered = True
        if self.workload is not None:
            self.workload.finish(FAILED, reason)
        if self.client is GONE:
            return
        self.context.sendError(
            self.request, self.engine, status, reason, MESSAGES.get(reason, reason), retryAfter
        )
