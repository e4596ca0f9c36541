"""The two placement policies (spec §5, §5.4): where a request is tried, how often, and
what it is answered when no attempt commits.

A policy is a generator driven by the exchange (``IPlacementExchange``): it yields the
Deferred it waits for (an attempt's outcome, or a pause) and is sent its result.  It ends
once an attempt committed (the exchange then serves it) or once it has answered the request
itself.  A cancelled wait (client gone, shutdown) closes the generator where it waits.

In standalone mode with ``--affinity prefix`` the inference policy orders each round with
``affinity.Affinity.place`` instead of ``placeReservation`` (a pin still wins), and the
node that commits becomes the conversation's home.  A request whose placement is a hold for
its full prefix holder waits in the proxy (``IPlacementExchange.holdFor``), then is placed
again.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from itertools import chain
from typing import TYPE_CHECKING

from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import RouteClass
from nvpair.proxy.placement.choose import Choice, Hold
from nvpair.proxy.placement.interfaces import IOutcome, IPlacementExchange
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.placement.responses import NOT_FOUND_CODE, NOT_FOUND_STATUS, Predecessor, followUp
from nvpair.proxy.routing.candidates import orderCandidates, placeReservation
from nvpair.proxy.routing.nodes import Node

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from nvpair.proxy.nodestate.interfaces import IResidency

# What a policy yields (an attempt, or a pause), is sent back (the attempt's outcome, or
# None after a pause, and None to start it), and returns.
Policy = Generator["Deferred[IOutcome] | Deferred[None]", "IOutcome | None", None]


class _Round:
    """The state an inference request's placement carries from round to round: its
    budget (attempts tried, the job deadline, the next backoff), its prompt digests, and
    whether it may still be held for a prefix holder."""

    __slots__ = (
        *("ex", "model", "deadline", "backoff", "tried", "key", "counted", "hold", "load"),
        "moved",
    )

    def __init__(self, ex: IPlacementExchange, model: str) -> None:
        self.ex = ex
        self.model = model
        self.deadline = ex.createdAt + ex.settings.jobDeadline
        self.backoff = ex.settings.backoffBase
        self.tried = 0
        self.key: AffinityKey | None = None
        self.counted: str | None = ex.facade.engine.id  # placements count once per request
        self.hold = Hold.ALLOWED  # held in the proxy for its prefix holder at most once
        self.load: str | None = None  # the node where this round would start a load
        self.moved = False  # the last round's attempt was moved off an engine's queue

    def owners(self) -> Generator[Deferred[None], IOutcome | None, tuple[Node, ...] | None]:
        """The model's owners, once there are some: with none, 502 ``no_owner`` before any
        dispatch, else a wait for discovery within the deadline (None once answered).
        ``placeInference`` reads them itself first: no generator in the usual case."""
        ex = self.ex
        facade = ex.facade
        while not (owners := facade.snapshot.owners(self.model, facade.hasLocalBackend)):
            if not self.tried:
                ex.answerError(502, "no_owner")
                return None
            if not (yield from self.backOff("owner_unavailable", True)):
                return None
        return owners

    def follow(self, owners: tuple[Node, ...]) -> tuple[Node, ...] | None:
        """A Responses follow-up goes to the node that stored its predecessor (its input
        holds only the new turn): that owner alone; when that node no longer owns the model
        the answer is 404 ``previous_response_not_found`` (None), never a node that cannot
        know the id; a predecessor the proxy never saw served is placed as usual."""
        ex = self.ex
        previous = ex.facts.previousResponseId
        if previous is None:  # (``placeInference`` asks first)
            return owners
        found = followUp(ex.context.responses, previous, {node.id for node in owners})
        if found.predecessor is Predecessor.GONE:
            ex.answerError(NOT_FOUND_STATUS, NOT_FOUND_CODE)
            return None
        if found.predecessor is Predecessor.STORED:
            return tuple(node for node in owners if node.id == found.node)
        return owners

    def usable(self, owners: tuple[Node, ...]) -> tuple[Node, ...]:
        """The owners this round may use: in standalone mode, placement that counts loads
        (``loads.LoadPlanner``) over the owners whose breaker is not open (all of them when
        every breaker is); under a broker, all of them."""
        ex = self.ex
        loads = ex.context.loads
        self.load = None
        if loads is None:
            return owners
        backlog = ex.seat.backlog()  # read first: it notes a load paying for the queue
        if loads.warm(owners, self.model):
            return owners  # nothing to narrow: no model state says otherwise
        plan = loads.plan(owners, self.model, backlog)
        if plan.load is None and len(plan.usable) == len(owners):
            return owners
        broken = ex.seat.demote(owners)[2]
        if broken and len(broken) < len(owners):
            healthy = tuple(node for node in owners if node not in broken)
            plan = loads.plan(healthy, self.model, backlog)
        self.load = None if plan.load is None else plan.load.id
        return plan.usable

    def backOff(
        self, reason: str, wakeOnDiscovery: bool
    ) -> Generator[Deferred[None], IOutcome | None, bool]:
        """Wait out the backoff within the job deadline (False once answered 503 ``reason``
        because none is left); the next one doubles, up to ``--backoff-max``."""
        ex = self.ex
        remaining = self.deadline - ex.clock.seconds()
        if remaining <= 0:
            ex.unavailable(reason)
            return False
        yield ex.pause(min(self.backoff, remaining), wakeOnDiscovery)
        self.backoff = float(min(self.backoff * 2, ex.settings.backoffMax))
        return True

    def choose(self, owners: tuple[Node, ...]) -> tuple[Iterable[Node], Choice | None]:
        """This round's candidates in order, the first reserved, and the placement's choice
        (None where affinity does not place: under a broker, ``--affinity off``, a pin, a
        request without prompt digests)."""
        ex = self.ex
        facade = ex.facade
        reservations = ex.context.reservations
        affinity = ex.context.affinity
        # Taken at admission, and only in a fleet of several nodes: one has no choice to make.
        self.key = ex.prefixKey if affinity is not None else None
        # Known-full owners go after those with room, open breakers last; placement by cache
        # weighs the full ones itself (the ledger says they have no room).  With none full,
        # ``preferred`` stays the snapshot's owner tuple, whose ordering is cached.
        preferred, full, demoted = ex.seat.demote(owners)
        key = self.key
        if full:
            preferred = (*preferred, *full)
        ordered, pinApplied = orderCandidates(preferred, facade.pin, reservations.rank)
        choice = None
        if key is not None and affinity is not None and not pinApplied:
            # A spent hold asks whether others wait in the proxy (choose: "crowded").
            crowded = self.hold is Hold.SPENT and ex.seat.crowded()
            choice = affinity.place(ordered, key, self.model, self.hold, self.counted, crowded)
            target = choice.node if choice is not None and choice.hold is None else None
        else:
            target = placeReservation(ordered, pinApplied, reservations)
        if target is not None:
            ex.reserve(target.id)
        if choice is not None and choice.hold is None:
            self.counted = None
            if self.hold is Hold.ROOMY:
                self.hold = Hold.SPENT  # a later round (after a failed attempt) is not held
        return chain(ordered, demoted), choice

    def held(self, choice: Choice) -> Generator[Deferred[None], IOutcome | None, None]:
        """Hold the request in the proxy for its full prefix holder, at most as long as
        recomputing elsewhere would take (spec §11 "Placement"); then it is placed again,
        at the holder when it has room, else recomputing where there is room."""
        ex = self.ex
        assert choice.hold is not None
        wait = ex.seat.holdFor(choice.node, choice.hold)
        if wait is None:
            self.hold = Hold.NONE  # it cannot be held: it waits in the holder's engine
            return
        yield wait
        self.hold = Hold.SPENT if ex.seat.knownFull((choice.node,)) else Hold.ROOMY

    def attempts(
        self, candidates: Iterable[Node], owners: tuple[Node, ...]
    ) -> Generator[Deferred[IOutcome], IOutcome | None, bool]:
        """Try this round's candidates in order; True once the request is answered (a
        commit, or a final answer), False for another round."""
        ex = self.ex
        facade = ex.facade
        snapshot = facade.snapshot
        maxAttempts = ex.settings.maxDispatchAttempts
        for candidate in candidates:
            if self.tried >= maxAttempts:
                ex.unavailable("attempts_exhausted")
                return True
            if ex.clock.seconds() >= self.deadline:
                ex.unavailable("deadline_exceeded")
                return True
            node = candidate
            if facade.snapshot is not snapshot:
                # Discovery changed during this round: never try a node that has left or
                # stopped advertising the model (failover never broadens).
                live = facade.snapshot.get(candidate.id)
                if live is None or live not in facade.snapshot.owners(
                    self.model, facade.hasLocalBackend
                ):
                    continue
                node = live
            self.tried += 1
            final = self.tried == maxAttempts
            loading = None if self.load is None else self.startLoad(node)
            outcome = yield ex.attemptOn(node, final, gated=True)
            assert outcome is not None  # an attempt fires with its outcome
            if outcome.committed:
                if self.key is not None:
                    self.served(node)
                return True
            if loading is not None:
                loading.loadAbandoned(node.id, self.model)
            if final:
                ex.answerFinal(outcome)
                return True
            ex.retrying()
            if outcome.kind is FailureKind.MOVED:
                self.moved = True
                break  # placed again at once, where the ledger now sees room
            if ex.seat.knownFull(owners):
                break  # every owner is busy now: wait in the queue rather than try them
        ex.releaseReservation()
        return False

    def startLoad(self, node: Node) -> IResidency | None:
        """Going to the node where this round starts a load: the model is loading there
        from now on (the residency view, returned), so the next requests wait for it."""
        residency = self.ex.context.residency
        if node.id != self.load or residency is None:
            return None
        self.load = None
        residency.loadStarted(node.id, self.model)
        self.ex.seat.loadStarted()
        return residency

    def served(self, node: Node) -> None:
        """``node`` committed: it is the conversation's home (a failover moves it)."""
        affinity = self.ex.context.affinity
        if self.key is not None and affinity is not None:
            affinity.served(self.key, node.id)


def placeInference(ex: IPlacementExchange) -> Policy:
    """Inference policy: wait (for owners, or in the fair queue while every owner is full),
    choose, hold or attempt; rounds bounded by attempts and the job deadline, up to a commit
    or a final answer."""
    if ex.model is None:  # admission refuses an inference request that names no model
        ex.answerError(502, "no_owner")
        return None
    placing = _Round(ex, ex.model)
    if ex.context.residency is not None:  # standalone: the fleet's demand for the model
        ex.context.residency.requested(ex.model)
    facade, follows = ex.facade, ex.facts.previousResponseId is not None
    while True:
        owners = facade.snapshot.owners(placing.model, facade.hasLocalBackend) or (
            yield from placing.owners()
        )
        if owners is None or (follows and (owners := placing.follow(owners)) is None):
            return None
        if ex.context.loads is not None:  # standalone
            owners = placing.usable(owners)
        wait = ex.seat.waitForRoom(owners)  # standalone: the fair queue while all are full
        if wait is not None:
            yield wait
            continue  # let out: the current owners, in a new round
        candidates, choice = placing.choose(owners)
        if choice is not None and choice.hold is not None:
            yield from placing.held(choice)
            continue
        if (yield from placing.attempts(candidates, owners)):
            return None
        moved, placing.moved = placing.moved, False
        if moved or ex.seat.knownFull(owners):
            continue  # moved, or every owner is busy: place again, or wait in the queue
        if not (yield from placing.backOff("deadline_exceeded", False)):
            return None


def placeVerbatim(ex: IPlacementExchange) -> Policy:
    """Non-inference policy: candidates resolved once, each tried at most once, no backoff,
    up to a commit or a final answer."""
    facade = ex.facade
    owners: tuple[Node, ...] = ()
    if ex.model is not None:
        owners = facade.snapshot.owners(ex.model, facade.hasLocalBackend)
    if not owners:
        owners = tuple(n for n in facade.snapshot.nodes if not n.isSelf or facade.hasLocalBackend)

    def live(node: Node) -> Node | None:
        return node if node.id in facade.snapshot else None  # it left discovery meanwhile

    return (yield from _eachOnce(ex, owners, False, live))


def placeModelRouted(ex: IPlacementExchange) -> Policy:
    """Model-routed policy (protocol §11 "model-routed, not workloads": token counts): the
    owners of the body's model in the usual order, each tried at most once, failing over
    on a transport error, 404 or 5xx; no workload, queue, reservation or backoff."""
    model = ex.model
    if model is None:  # admission refuses a body without a string model first
        ex.answerError(400, "bad_request")
        return None
    facade = ex.facade

    def live(node: Node) -> Node | None:
        current = facade.snapshot  # it may have left, or stopped advertising the model
        found = current.get(node.id)
        return found if found in current.owners(model, facade.hasLocalBackend) else None

    return (
        yield from _eachOnce(ex, facade.snapshot.owners(model, facade.hasLocalBackend), True, live)
    )


def _eachOnce(
    ex: IPlacementExchange,
    owners: tuple[Node, ...],
    gated: bool,
    live: Callable[[Node], Node | None],
) -> Policy:
    """Try ``owners`` in the usual order, each at most once (the last as final), up to a
    commit or a final answer; once discovery changed, a node ``live`` no longer finds is
    skipped (502 ``upstream_unreachable`` when it was the last)."""
    facade = ex.facade
    snapshot = facade.snapshot
    ordered, _ = orderCandidates(owners, facade.pin, ex.context.reservations.rank)
    if not ordered:
        ex.answerError(502, "no_owner")
        return None
    last = len(ordered) - 1
    for index, node in enumerate(ordered):
        if facade.snapshot is not snapshot:
            current = live(node)
            if current is None:
                if index == last:
                    ex.answerError(502, "upstream_unreachable")
                    return None
                continue
            node = current
        outcome = yield ex.attemptOn(node, index == last, gated=gated)
        assert outcome is not None  # an attempt fires with its outcome
        if outcome.committed or index == last:
            if not outcome.committed:
                ex.answerFinal(outcome)
            return None
    return None


POLICIES: dict[RouteClass, Callable[[IPlacementExchange], Policy]] = {
    RouteClass.INFERENCE: placeInference,
    RouteClass.MODEL_ROUTED: placeModelRouted,
    RouteClass.VERBATIM: placeVerbatim,
}
"""The placement policy of each route class that becomes an exchange."""
