"""The dispatch loop (spec §5, §5.1, §5.4): candidates, attempts, backoff, and the one ending.

``Exchange`` is one client request on its way through the fleet.  It drives the route
class's placement policy (``placement``) and owns the one terminal bookkeeping step
(workload event, reservation release, in-flight count) whatever path ends the request.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.proxy.broker.workloads import CANCELLED, COMPLETED, FAILED, Workload
from nvpair.proxy.dispatch import attempt as att
from nvpair.proxy.dispatch.attempt import Attempt, Committed, Failed, Outcome
from nvpair.proxy.dispatch.relay import (
    ClientFlow,
    abortClient,
    adoptResponseHeaders,
    truncateClient,
)
from nvpair.proxy.routing.placement import Policy, placeInference, placeVerbatim
from nvpair.proxy.routing.stats import StatsMeter

_MESSAGES = {
    "no_owner": "no node advertises this model",
    "upstream_unreachable": "the last permitted attempt failed at the transport",
    "no_content": "the last permitted attempt produced no content in time",
    "deadline_exceeded": "the job deadline passed while attempts were failing",
    "owner_unavailable": "no owner of this model became available before the deadline",
    "attempts_exhausted": "every permitted dispatch attempt failed",
    "internal": "internal proxy error",
}


_NO_HEADERS = Headers()
_WAITING = object()  # no result yet for what the policy waits for

# Per-request values that depend only on a bounded key, computed once.
_NODE_HEADERS: dict[str, tuple[bytes]] = {}  # node id -> the x-nvpair-node values
_DIALECTS: dict[tuple[str, bytes], str] = {}  # (engine id, inference path) -> stats dialect
_CACHE_CAP = 4096


def _nodeHeader(nodeId: str) -> tuple[bytes]:
    value = _NODE_HEADERS.get(nodeId)
    if value is None:
        value = (nodeId.encode(),)
        if len(_NODE_HEADERS) < _CACHE_CAP:
            _NODE_HEADERS[nodeId] = value
    return value


def _statsDialect(engine: Any, path: bytes) -> str:
    key = (engine.id, path)
    dialect = _DIALECTS.get(key)
    if dialect is None:
        dialect = engine.statsDialect(path)
        if len(_DIALECTS) < _CACHE_CAP:
            _DIALECTS[key] = dialect
    return dialect


class Exchange:
    """One client request on its way through the fleet, and everything its ending touches."""

    log = Logger()

    # Slots: one Exchange lives as long as its stream; no per-instance dict.
    __slots__ = (
        "context",
        "facade",
        "engine",
        "settings",
        "clock",
        "upstream",
        "request",
        "method",
        "uri",
        "path",
        "forwardHeaders",
        "body",
        "document",
        "inference",
        "model",
        "createdAt",
        "workload",
        "reservation",
        "activeNode",
        "attempts",
        "meter",
        "flow",
        "committedStatus",
        "expectedLength",
        "written",
        "clientGone",
        "truncated",
        "stopping",
        "answered",
        "loop",
        "serving",
        "policy",
        "stepping",
        "early",
    )

    def __init__(
        self,
        context: Any,
        facade: Any,
        request: Any,
        inference: bool,
        model: str | None,
        body: bytes,
        document: dict[str, object] | None = None,
    ) -> None:
        self.context = context
        self.facade = facade
        self.engine = facade.engine
        self.settings = context.settings
        self.clock = context.clock
        self.upstream = context.upstream
        self.request = request
        self.method: bytes = request.method
        self.uri: bytes = request.uri
        self.path: bytes = request.path
        self.forwardHeaders: Headers = context.forwardHeaders(request.requestHeaders)
        self.body = body
        self.document = document  # the parsed body admission found, when it parsed one
        self.inference = inference
        self.model = model
        self.createdAt: float = self.clock.seconds()
        self.workload: Workload | None = None
        self.reservation: Any = None
        self.activeNode: str | None = None
        self.attempts = 0
        self.meter: StatsMeter | None = None
        self.flow: ClientFlow | None = None
        self.committedStatus: int | None = None
        self.expectedLength: int | None = None
        self.written = 0
        self.clientGone = False
        self.truncated = False
        self.stopping = False
        self.answered = False
        self.loop: defer.Deferred[Any] | None = None  # what the policy waits for now
        self.serving: Committed | None = None
        self.policy: Policy | None = None
        self.stepping = False
        self.early: object = _WAITING

    # -- life of the exchange -------------------------------------------------------------

    def start(self) -> None:
        """Admit (workload ``submitted``) and run the policy for this route class."""
        if self.inference and self.model is not None:
            self.workload = self.context.reporter.admit(self.engine.id, self.model)
        self.context.exchanges.add(self)
        request = self.request
        whenLost = getattr(request, "whenLost", None)
        if whenLost is not None:
            whenLost(self._clientLost)  # the facade's own request: no Deferred needed
        else:
            request.notifyFinish().addErrback(self._clientLost)
        if request.disconnected:
            self.clientGone = True  # gone before we started: notifyFinish will never fire
            self._terminal()
            return
        self.policy = (placeInference if self.inference else placeVerbatim)(self)
        self._advance(None)

    # -- driving the policy ---------------------------------------------------------------

    # The policy generator is driven here rather than by ``Deferred.fromCoroutine``: most
    # requests commit on their first attempt, and a coroutine costs several Deferred and
    # frame hops per step.  The loop is a trampoline: a wait that is already over when it
    # is yielded continues the loop instead of nesting a call.

    def _advance(self, result: object) -> None:
        """Send ``result`` to the policy and run it up to its next unfinished wait."""
        policy = self.policy
        assert policy is not None
        while True:
            try:
                waiting = policy.send(result)
            except StopIteration as done:
                self.policy = None
                self._placed(done.value)
                return
            except Exception as e:
                self.policy = None
                self._internal(e)
                self._terminal()
                return
            self.loop = waiting
            if self.clientGone or self.stopping:
                waiting.cancel()  # cancelled while the policy ran between two waits
            self.early = _WAITING
            self.stepping = True
            waiting.addCallbacks(self._resumed, self._interrupted)
            self.stepping = False
            early, self.early = self.early, _WAITING
            if early is _WAITING:
                return  # the wait is still on: ``_resumed`` continues
            if isinstance(early, Failure):
                self._interrupted(early)
                return
            result = early

    def _resumed(self, result: object) -> None:
        if self.stepping:
            self.early = result  # finished inside ``addCallbacks``: the loop goes on
            return
        if self.policy is not None:
            self._advance(result)

    def _interrupted(self, failure: Failure) -> None:
        """The wait failed: cancelled (client gone, shutdown) or a crash in the attempt."""
        if self.stepping:
            self.early = failure
            return
        policy, self.policy = self.policy, None
        if policy is None:
            return
        policy.close()
        if not failure.check(defer.CancelledError):
            self._internal(failure.value)  # type: ignore[arg-type]
        self._terminal()

    def _placed(self, committed: Committed | None) -> None:
        """The policy ended: serve what committed, or end now if it answered itself."""
        streaming = False
        try:
            if committed is not None:
                streaming = self.serve(committed)
        except Exception as e:
            self._internal(e)
        finally:
            if not streaming:
                self._terminal()

    def _internal(self, e: Exception) -> None:
        self.log.failure("request-crashed", engine=self.engine.id, path=self.path.decode("latin-1"))
        self.context.reportInternal(type(e).__name__)
        if self.committedStatus is None:
            self.answerError(500, "internal")
        elif not self.clientGone:
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
        if self.workload is not None and not self.workload.ended:
            if self.clientGone and not self.stopping and self._answerDelivered():
                # The client read the whole answer and hung up before the engine closed the
                # body (the openai client stops at ``data: [DONE]``): that is a completion.
                stats = self.meter.result(self.clock.seconds()) if self.meter else None
                self.workload.finish(COMPLETED, None, stats)
                self.context.requestEnded(self)
                return
            cancelled = self.clientGone or self.stopping
            self.workload.finish(
                CANCELLED if cancelled else FAILED, "cancelled" if cancelled else "internal"
            )
        self.context.requestEnded(self)

    def _answerDelivered(self) -> bool:
        """Whether a committed 2xx answer was passed on whole: all of its Content-Length, or
        a stream whose last event is the dialect's end-of-answer marker."""
        status = self.committedStatus
        if status is None or not 200 <= status < 300:
            return False
        if self.expectedLength is not None:
            return self.written >= self.expectedLength
        return self.meter is not None and self.meter.sawEnd()

    def _clientLost(self, _: object) -> None:
        if self.clientGone or self.truncated:
            return  # already handled, or the loss is our own abort of a truncated stream
        self.clientGone = True
        self._cancel()

    def _cancel(self) -> None:
        """Cancel the placement loop, or the committed body being served."""
        if self.loop is not None and not self.loop.called:
            self.loop.cancel()
            return
        committed = self.serving
        if committed is not None:
            self.serving = None
            committed.over = True
            committed.attempt.stopBody()
            self._terminal()

    def deadClient(self) -> None:
        """The client stopped reading for longer than the write deadline: cut it off."""
        if self.clientGone:
            return
        abortClient(self.request)
        self._clientLost(None)

    def shutdown(self) -> None:
        """The process is stopping: cancel this request (reported cancelled)."""
        self.stopping = True
        if not self.clientGone:
            abortClient(self.request)
        self._cancel()

    # -- reservations and in-flight counts -----------------------------------------------

    def reserve(self, nodeId: str) -> None:
        """Take this round's reservation on ``nodeId``."""
        self.releaseReservation()
        self.reservation = self.context.reservations.reserve(nodeId)

    def releaseReservation(self) -> None:
        """Release the reservation, if any (before a backoff and at the end)."""
        if self.reservation is not None:
            self.reservation.release()
            self.reservation = None

    def _setActive(self, nodeId: str | None) -> None:
        if self.activeNode is not None:
            self.context.activity.change(self.activeNode, -1)
        self.activeNode = nodeId
        if nodeId is not None:
            self.context.activity.change(nodeId, +1)

    # -- attempts -------------------------------------------------------------------------

    # ``dispatch`` and ``serve`` hand back the Deferred they end with rather than being
    # coroutines themselves: each coroutine level is resumed on every step of the loop.

    def dispatch(self, node: Any, final: bool, gated: bool) -> defer.Deferred[Outcome]:
        """One attempt on ``node``: move the reservation, report the placement, run it."""
        self.attempts += 1
        if self.reservation is not None:
            self.reservation.moveTo(node.id)
        if self.workload is not None:
            self.workload.submitted(node.id)
        self._setActive(node.id)
        return Attempt(self, node, final, gated).start()

    def attemptFailed(self, outcome: Failed) -> None:
        """The attempt ended uncommitted (called by it just before its Deferred fires)."""
        self._setActive(None)
        self.context.attemptFailed(self, outcome)

    def serve(self, committed: Committed) -> bool:
        """The response committed: report it running; True while its body still streams.

        When it does, the exchange ends when the body does (``bodyEnded``) or is cancelled.
        """
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

    def _served(self, ending: str, committed: Committed) -> None:
        if self.workload is None:
            return
        if ending == att.CLIENT_GONE or self.clientGone:
            self.workload.finish(CANCELLED, "client disconnected")
            return
        stats = None
        if self.meter is not None:
            stats = self.meter.result(self.clock.seconds())
        if 200 <= committed.status < 300:
            self.workload.finish(COMPLETED, None, stats)
        else:
            self.workload.finish(FAILED, f"upstream status {committed.status}", stats)

    # -- writing the client's answer -------------------------------------------------------

    def writeHead(
        self,
        attempt: Attempt,
        code: int,
        phrase: bytes,
        headers: Headers,
        length: int | None,
        upstream: IPushProducer,
    ) -> None:
        """Commit: status and headers to the client, upstream registered as its producer."""
        self.committedStatus = code
        self.expectedLength = length
        self.answered = True
        request = self.request
        # Committed: no further attempt will send the request, so its copies can go now
        # rather than when the (possibly long) stream ends.
        self.body = b""
        self.forwardHeaders = _NO_HEADERS
        content = getattr(request, "content", None)
        if content is not None:
            content.close()
        request.setResponseCode(code, phrase)
        adoptResponseHeaders(headers, request, length)
        responseHeaders = request.responseHeaders
        responseHeaders.setRawHeaders(b"X-Nvpair-Node", _nodeHeader(attempt.node.id))
        responseHeaders.setRawHeaders(b"X-Nvpair-Attempts", (b"%d" % self.attempts,))
        if self.inference and code < 400:
            meter = self.meter = StatsMeter(_statsDialect(self.engine, self.path), self.createdAt)
            meter.firstByte(self.clock.seconds())
        self.context.committed(self, attempt.node.id)
        if self.clientGone:
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
        if not self.clientGone:
            self.written += len(data)
            self.request.write(data)

    def endBody(self, clean: bool) -> str:
        """The upstream body ended; finish or cut the client's response."""
        if self.flow is not None:
            self.flow.cancel()
        if self.clientGone:
            return att.CLIENT_GONE
        request = self.request
        request.unregisterProducer()
        if clean:
            request.finish()
            return att.COMPLETE
        self.truncated = True
        truncateClient(request, self.clock, self.settings.clientWriteTimeout or 60.0)
        return att.TRUNCATED

    def answerError(self, status: int, reason: str, retryAfter: int | None = None) -> None:
        """Send a response the proxy generates itself, in the engine's error shape."""
        self.answered = True
        if self.workload is not None:
            self.workload.finish(FAILED, reason)
        if self.clientGone:
            return
        self.context.sendError(
            self.request, self.engine, status, reason, _MESSAGES.get(reason, reason), retryAfter
        )

    def unavailable(self, reason: str) -> None:
        """The loop ended between attempts: 503 with Retry-After naming why."""
        self.answerError(503, reason, self.settings.retryAfter)

    def answerFinal(self, outcome: Failed) -> None:
        """The final permitted attempt failed uncommitted: it answers for itself."""
        if outcome.kind == att.NO_CONTENT:
            self.answerError(504, "no_content")
        else:
            self.answerError(502, "upstream_unreachable")

    def pause(self, seconds: float, wakeOnDiscovery: bool) -> defer.Deferred[Any]:
        """Wait ``seconds`` (or until discovery changes, when asked), cancellably."""
        sleep: defer.Deferred[Any] = task.deferLater(self.clock, max(seconds, 0.0), lambda: None)
        if not wakeOnDiscovery:
            return sleep
        return defer.race([sleep, self.facade.nextSnapshot()])
