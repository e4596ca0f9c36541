"""The two placement policies (spec §5, §5.4): where a request is tried, how often, and
what it is answered when no attempt commits.

A policy is a generator driven by the exchange (``IPlacementExchange``): it yields the
Deferred it waits for (an attempt's outcome, or a pause) and is sent its result.  It ends
once an attempt committed (the exchange then serves it) or once it has answered the request
itself.  A cancelled wait (client gone, shutdown) closes the generator where it waits.

In standalone mode with ``--affinity prefix`` the inference policy orders each round with
``affinity.Affinity.place`` instead of ``placeReservation`` (a pin still wins), and the
node that commits becomes the conversation's home.  A request placement holds for its full
prefix holder waits in the proxy (``IPlacementExchange.holdFor``), then is placed again.
"""

from __future__ import annotations

from collections.abc import Generator
from itertools import chain
from typing import TYPE_CHECKING

from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.choose import Hold
from nvpair.proxy.placement.interfaces import IOutcome, IPlacementExchange
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.routing.candidates import orderCandidates, placeReservation
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

# What a policy yields (an attempt, or a pause), is sent back (the attempt's outcome, or
# None after a pause, and None to start it), and returns.
Policy = Generator["Deferred[IOutcome] | Deferred[None]", "IOutcome | None", None]


def _backOff(
    ex: IPlacementExchange, deadline: float, backoff: float, reason: str, wakeOnDiscovery: bool
) -> Generator[Deferred[None], IOutcome | None, float | None]:
    """Wait out ``backoff`` within the job deadline (answering 503 ``reason`` when none is
    left); the next, doubled backoff, or None once answered."""
    remaining = deadline - ex.clock.seconds()
    if remaining <= 0:
        ex.unavailable(reason)
        return None
    yield ex.pause(min(backoff, remaining), wakeOnDiscovery)
    return float(min(backoff * 2, ex.settings.backoffMax))


def placeInference(ex: IPlacementExchange) -> Policy:
    """Inference policy: rounds over the owners, bounded by attempts and the job deadline,
    up to a commit or a final answer."""
    model = ex.model
    if model is None:  # admission refuses an inference request that names no model
        ex.answerError(502, "no_owner")
        return None
    settings = ex.settings
    clock = ex.clock
    facade = ex.facade
    reservations: ReservationMap = ex.context.reservations
    deadline = ex.createdAt + settings.jobDeadline
    backoff = settings.backoffBase
    maxAttempts = settings.maxDispatchAttempts
    tried = 0
    affinity: Affinity | None = ex.context.affinity  # standalone with --affinity prefix
    # Taken at admission, and only in a fleet of several nodes: one has no choice to make.
    key: AffinityKey | None = ex.prefixKey if affinity is not None else None
    counted: str | None = facade.engine.id  # affinity outcomes count once per request
    hold = Hold.ALLOWED  # held in the proxy for its prefix holder at most once
    while True:
        snapshot = facade.snapshot
        owners = snapshot.owners(model, facade.hasLocalBackend)
        if not owners:
            if not tried:
                ex.answerError(502, "no_owner")
                return None
            waited = yield from _backOff(ex, deadline, backoff, "owner_unavailable", True)
            if waited is None:
                return None
            backoff = waited
            continue
        wait = ex.waitForRoom(owners)  # standalone: the fair queue while all are full
        if wait is not None:
            yield wait
            continue  # let out: the current owners, in a new round
        # Known-full owners go after those with room, open breakers last; prefix placement
        # weighs the full ones itself (a full prefix holder may be worth a short hold).
        preferred, full, demoted = ex.demote(owners)
        if key is None or affinity is None:
            demoted, full = (*full, *demoted), ()
        elif full:
            preferred = (*preferred, *full)
        ordered, pinApplied = orderCandidates(preferred, facade.pin, reservations.rank)
        if key is not None and affinity is not None and not pinApplied:
            target = affinity.place(ordered, key, reservations, counted, model, hold, full)
            if key.hold is not None and target is not None:
                # Its prefix holder is full: held in the proxy for a slot there, at most as
                # long as recomputing elsewhere would take (spec §11 "Placement").
                wait = ex.holdFor(target, key.hold)
                if wait is None:
                    hold = Hold.NONE  # it cannot be held: it waits in the holder's engine
                    continue
                yield wait
                hold = Hold.SPENT if ex.knownFull((target,)) else Hold.ROOMY
                continue
            counted = None
            if hold is Hold.ROOMY:
                hold = Hold.SPENT  # a later round (after a failed attempt) is not held
        else:
            target = placeReservation(ordered, pinApplied, reservations)
        if target is not None:
            ex.reserve(target.id)
        for node in chain(ordered, demoted):
            if tried >= maxAttempts:
                ex.unavailable("attempts_exhausted")
                return None
            if clock.seconds() >= deadline:
                ex.unavailable("deadline_exceeded")
                return None
            if facade.snapshot is not snapshot:
                # Discovery changed during this round: never try a node that has
                # left or stopped advertising the model (failover never broadens).
                current = facade.snapshot
                live = current.get(node.id)
                if live is None or live not in current.owners(model, facade.hasLocalBackend):
                    continue
                node = live
            tried += 1
            final = tried == maxAttempts
            outcome = yield ex.attemptOn(node, final, gated=True)
            assert outcome is not None  # an attempt fires with its outcome
            if outcome.committed:
                if key is not None and affinity is not None:
                    affinity.served(key, node.id)  # a failover moves the conversation
                return None
            if final:
                ex.answerFinal(outcome)
                return None
            ex.retrying()
            if ex.knownFull(owners):
                break  # every owner is busy now: wait in the queue rather than try them
        ex.releaseReservation()
        if ex.knownFull(owners):
            continue  # every owner is busy: wait in the queue rather than back off
        waited = yield from _backOff(ex, deadline, backoff, "deadline_exceeded", False)
        if waited is None:
            return None
        backoff = waited


def placeVerbatim(ex: IPlacementExchange) -> Policy:
    """Non-inference policy: candidates resolved once, each tried at most once, no backoff,
    up to a commit or a final answer."""
    facade = ex.facade
    snapshot = facade.snapshot
    owners: tuple[Node, ...] = ()
    if ex.model is not None:
        owners = snapshot.owners(ex.model, facade.hasLocalBackend)
    if not owners:
        owners = tuple(n for n in snapshot.nodes if not n.isSelf or facade.hasLocalBackend)
    ordered, _ = orderCandidates(owners, facade.pin, ex.context.reservations.rank)
    if not ordered:
        ex.answerError(502, "no_owner")
        return None
    last = len(ordered) - 1
    for index, node in enumerate(ordered):
        if facade.snapshot is not snapshot and node.id not in facade.snapshot:
            if index == last:
                ex.answerError(502, "upstream_unreachable")
                return None
            continue  # it left discovery meanwhile
        outcome = yield ex.attemptOn(node, index == last, gated=False)
        assert outcome is not None  # an attempt fires with its outcome
        if outcome.committed:
            return None
        if index == last:
            ex.answerFinal(outcome)
            return None
    return None
