"""The placement loop of an exchange: driving its policy (``routing.placement``) through the
waits it yields, and doing what the policy asks besides trying a node (reserve, wait, give up).

The policy generator is driven here rather than by ``Deferred.fromCoroutine``: most
requests commit on their first attempt, and a coroutine costs several Deferred and frame
hops per step.  The loop is a trampoline: a wait that is already over when it is yielded
continues the loop instead of nesting a call.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Final

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nvpair.proxy.dispatch.interfaces import IFacadeView
from nvpair.proxy.dispatch.outcome import GONE, ClientState, FailureKind
from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.interfaces import IRequestContext
from nvpair.proxy.routing.admission import bodyDocument
from nvpair.proxy.routing.clients import clientKey
from nvpair.proxy.routing.interfaces import IOutcome, IPlacementExchange
from nvpair.proxy.routing.placement import Policy
from nvpair.proxy.routing.reservations import Reservation

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nvpair.proxy.broker.workloads import Workload
    from nvpair.proxy.routing.nodes import Node
    from nvpair.proxy.settings import Settings


class Early(Enum):
    """The result of a wait that ended within the ``addCallbacks`` that started it."""

    WAITING = "waiting"  # none yet: the wait is still on


WAITING: Final = Early.WAITING
_NO_CONTENT: Final = FailureKind.NO_CONTENT


def _nothing(_: object = None) -> None:
    return None


class PolicyDriver:
    """The placement loop of an ``Exchange``, its base class: the policy and what it waits
    for now (``loop``), ``stepping`` while a wait is being started and ``early``, ``WAITING``
    or the result of a wait that ended within its start; and the round's ``reservation``.

    The exchange sets these up in its own ``__init__`` (one call fewer per request), and
    provides the rest: the request's context, facade, settings, clock and workload;
    ``client`` and ``stopping``, for a wait yielded once the client left or the process is
    stopping is cancelled at once (the cancellation found nothing to cancel while the policy
    ran between two waits); and what happens when the policy ends (``_placed``), crashes
    (``_internal``, then ``_terminal``) or answers (``answerError``).
    """

    __slots__ = ("policy", "reservation", "loop", "stepping", "early", "queued")

    context: IRequestContext
    facade: IFacadeView
    settings: Settings
    clock: IReactorTime
    workload: Workload | None
    policy: Policy | None
    reservation: Reservation | None
    loop: defer.Deferred[IOutcome] | defer.Deferred[None] | None
    stepping: bool
    early: IOutcome | Failure | Early | None
    client: ClientState
    stopping: bool
    queued: int  # 0: not charged to its client yet; 1: charged; 2: just let out of the queue
    request: IServerRequest
    model: str | None
    body: bytes
    document: dict[str, object] | None

    def _placed(self) -> None:
        """The policy ended: an attempt committed, or it answered the request itself."""
        raise NotImplementedError

    def _internal(self, e: BaseException) -> None:
        """Report an unexpected exception and answer for it."""
        raise NotImplementedError

    def _terminal(self) -> None:
        """Release everything the request held and end it."""
        raise NotImplementedError

    def answerError(self, status: int, reason: str, retryAfter: int | None = None) -> None:
        """Answer the request with an error the proxy generates itself."""
        raise NotImplementedError

    def _advance(self, result: IOutcome | None) -> None:
        """Send ``result`` to the policy and run it up to its next unfinished wait."""
        policy = self.policy
        assert policy is not None
        while True:
            try:
                waiting = policy.send(result)
            except StopIteration:
                self.policy = None
                self._placed()
                return
            except Exception as e:
                self.policy = None
                self._internal(e)
                self._terminal()
                return
            self.loop = waiting
            if self.client is GONE or self.stopping:
                waiting.cancel()  # cancelled while the policy ran between two waits
            self.early = WAITING
            self.stepping = True
            waiting.addCallbacks(self._resumed, self._interrupted)
            self.stepping = False
            early, self.early = self.early, WAITING
            if early is WAITING:
                return  # the wait is still on: ``_resumed`` continues
            if isinstance(early, Failure):
                self._interrupted(early)
                return
            result = early

    def _resumed(self, result: IOutcome | None) -> None:
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
            error = failure.value
            assert error is not None  # a Failure holds its exception
            self._internal(error)
        self._terminal()

    # -- what the policy asks for, besides attempts (``IPlacementExchange``) -------------

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
        sleep = task.deferLater(self.clock, max(seconds, 0.0), _nothing)
        if not wakeOnDiscovery:
            return sleep
        return defer.race([sleep, self.facade.nextSnapshot()]).addCallback(_nothing)

    # -- the queue and the breakers (standalone; ``dispatch.queueing``) -------------------

    def waitForRoom(self, owners: Sequence[Node]) -> defer.Deferred[None] | None:
        """None to go on now; else wait in the queue: a Deferred that fires once dispatched
        (or fails with ``CancelledError`` once answered ``queue_full``/``queue_timeout``)."""
        queueing: Queueing | None = self.context.queueing
        if queueing is None or self.model is None:
            return None
        state = self.queued
        if state == 2:
            self.queued = 1  # just let out (and charged): it goes on
            return None
        if state == 1 and not queueing.knownFull(owners):
            return None  # a later round, already charged
        document = self.document
        authorization = self.request.requestHeaders.getRawHeaders(b"authorization")
        if document is None and not authorization:
            document = bodyDocument(self.body)
        # Peer requests are served on the local backend and never routed here: no peer id.
        client = clientKey(authorization[0] if authorization else None, document, None)
        wait = queueing.waitForRoom(IPlacementExchange(self), owners, client)
        if wait is None:
            self.queued = 1
            return None
        self.queued = 2
        return wait

    def knownFull(self, owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full (the next round waits in the queue
        instead of backing off)."""
        queueing: Queueing | None = self.context.queueing
        return queueing is not None and queueing.knownFull(owners)

    def demote(self, owners: Sequence[Node]) -> tuple[Sequence[Node], tuple[Node, ...]]:
        """``owners`` split by the node breakers: those to order as usual, then the demoted."""
        queueing: Queueing | None = self.context.queueing
        if queueing is None:
            return owners, ()
        return queueing.demote(owners)

    def retrying(self) -> None:
        """The failed attempt was not the last: the workload is queued again."""
        if self.workload is not None:
            self.workload.submitted(None)

    def unavailable(self, reason: str) -> None:
        """The loop ended between attempts: 503 with Retry-After naming why."""
        self.answerError(503, reason, self.settings.retryAfter)

    def answerFinal(self, outcome: IOutcome) -> None:
        """The final permitted attempt failed uncommitted: it answers for itself."""
        if outcome.kind is _NO_CONTENT:
            self.answerError(504, "no_content")
        else:
            self.answerError(502, "upstream_unreachable")
