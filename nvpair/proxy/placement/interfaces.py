"""What the placement policies need from the rest of the proxy, declared here so that routing
imports nothing of ``dispatch`` (nor of the network): the exchange they drive provides
``IPlacementExchange``, a facade provides ``IFleetView``, an attempt's ending ``IOutcome``,
the request context ``IPlacementContext``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IReactorTime

    from nvpair.proxy.engines import Engine
    from nvpair.proxy.nodestate.interfaces import IResidency
    from nvpair.proxy.placement.affinity import Affinity
    from nvpair.proxy.placement.keys import AffinityKey
    from nvpair.proxy.placement.responses import ResponseTable
    from nvpair.proxy.routing.candidates import Snapshot
    from nvpair.proxy.routing.facts import RequestFacts
    from nvpair.proxy.routing.nodes import Node, OwnerSplit
    from nvpair.proxy.routing.reservations import ReservationMap
    from nvpair.proxy.settings import Settings
    from nvpair.proxy.tracing.interfaces import IRequestTrace


@attrs.frozen
class LoadPlan:
    """The owners a request may go to now, and the one where it would start a load."""

    usable: tuple[Node, ...]
    load: Node | None = None


@attrs.frozen
class Backlog:
    """A model's queue in the proxy: how many wait, and the seconds its requests waited
    lately (decayed over about a minute)."""

    ahead: int = 0
    waited: float = 0.0


NO_BACKLOG = Backlog()


class IPlacementContext(Interface):
    """What placement reads of the process's request context (``IRequestContext`` extends
    it): the reservations it ranks and takes, and conversation affinity."""

    reservations: ReservationMap = Attribute("The reservation map.")
    responses: ResponseTable = Attribute(
        "Which node stored which OpenAI Responses answer: a follow-up goes there."
    )
    affinity: Affinity | None = Attribute(
        "Conversation affinity, or None where it is not ordering candidates (under a "
        "broker, or ``--affinity off``)."
    )
    loads: ILoadPlanner | None = Attribute(
        "Placement that counts loads (standalone mode), or None under a broker."
    )
    residency: IResidency | None = Attribute(
        "Which models each node holds (standalone mode), or None under a broker."
    )


class ILoadPlanner(Interface):
    """Which of a model's owners a request may use, counting loads (``loads.LoadPlanner``,
    spec §11 "Placement that counts loads")."""

    def loading(nodeId: str, model: str) -> bool:
        """Whether ``model`` is loading on ``nodeId`` (no room for it there until loaded)."""

    def noRoom(nodeId: str, model: str) -> bool:
        """Whether ``nodeId`` has no room for ``model`` whatever the node's own room: it is
        loading there, or its own parallel slots there are all ours
        (``IResidency.modelFull``)."""

    def warm(owners: Sequence[Node], model: str) -> bool:
        """Whether every one of ``owners`` is warm for ``model`` (``plan`` then answers them
        all, and no load)."""

    def plan(owners: Sequence[Node], model: str, backlog: Backlog) -> LoadPlan:
        """The owners a request for ``model`` may use now (``backlog``: the requests for it
        waiting in the proxy before it, and what they waited lately), and the one where it
        would start a load."""


class IFleetView(Interface):
    """What placement reads of a facade: its engine, discovery and pin."""

    engine: Engine = Attribute("The engine this facade speaks for.")
    snapshot: Snapshot = Attribute("The current discovery snapshot (replaced, never mutated).")
    pin: str | None = Attribute("The node id requests go to first when it owns the model.")
    hasLocalBackend: bool = Attribute("Whether a self node can be reached (a local backend).")


class IOutcome(Interface):
    """How one attempt ended, as a placement policy sees it."""

    committed: bool = Attribute("Whether the attempt's response became the client's answer.")
    node: Node = Attribute("The node the attempt went to.")
    kind: str | None = Attribute("Why an uncommitted attempt ended (None when committed).")


class ISeat(Interface):
    """One request's standing with standalone's flow control (``dispatch.seat.QueueSeat``):
    the fair queue, holds for a prefix holder, and the room and breakers that order its
    owners.  Under a broker there is none of it: it always goes on."""

    def waitForRoom(owners: Sequence[Node]) -> Deferred[None] | None:
        """None to go on now; else a Deferred that fires once the request is let out of the
        fair queue (every owner was known full), or fails with ``CancelledError`` once it
        has been answered (``queue_full``, ``queue_timeout``) or its client left."""

    def holdFor(node: Node, seconds: float) -> Deferred[None] | None:
        """Hold the request in the proxy for ``node``'s next free slot, at most
        ``seconds``; a Deferred that fires then (None: it cannot be held)."""

    def knownFull(owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full (always False under a broker); a
        node where the request's model is loading counts as full."""

    def crowded() -> bool:
        """Whether other requests wait in the proxy (held, or queued): a slot that frees
        elsewhere will be taken by one of them (always False under a broker)."""

    def loadStarted() -> None:
        """It goes to start a load of its model: what its queue waited so far is paid."""

    def backlog() -> Backlog:
        """The requests for its model waiting in the fair queue, and what that queue's
        requests waited lately (none under a broker)."""

    def demote(owners: Sequence[Node]) -> OwnerSplit:
        """``owners`` split: those to order as usual, then the known-full ones (while another
        owner has room), then those whose breaker is open (``owners`` and none under a
        broker)."""


class IPlacementExchange(Interface):
    """One client request as a placement policy drives it: what the policy reads of it, and
    what it may do with it (try a node, wait, reserve, answer)."""

    context: IPlacementContext = Attribute("The process's request context (reservations...).")
    facade: IFleetView = Attribute("The facade the request arrived on.")
    settings: Settings = Attribute("The process's settings (budget, deadline, backoff).")
    clock: IReactorTime = Attribute("The reactor's clock.")
    model: str | None = Attribute("The normalized model the request names, if any.")
    path: bytes = Attribute("The request's path, without the query.")
    body: bytes = Attribute("The request body.")
    facts: RequestFacts = Attribute("What admission read of the body (never the document).")
    createdAt: float = Attribute("When the request was admitted (clock seconds).")
    seat: ISeat = Attribute("Its standing with standalone's queue, holds and breakers.")
    trace: IRequestTrace | None = Attribute("The request's spans, or None (``--otel`` off).")
    prefixKey: AffinityKey | None = Attribute(
        "The prompt's digests (``keys.AffinityKey``), taken at admission where affinity "
        "places and the fleet had several nodes (else None); read when the request ends, "
        "for its cached-token count."
    )

    def attemptOn(node: Node, final: bool, gated: bool) -> Deferred[IOutcome]:
        """Try ``node`` once (``final``: no other attempt follows; ``gated``: commit on the
        first body byte rather than on headers); fires with the attempt's outcome."""

    def retrying() -> None:
        """An uncommitted attempt was not the last: the request is queued again."""

    def pause(seconds: float, wakeOnDiscovery: bool) -> Deferred[None]:
        """Wait ``seconds``, or until discovery changes when ``wakeOnDiscovery``."""

    def reserve(nodeId: str) -> None:
        """Take this round's reservation on ``nodeId``."""

    def releaseReservation() -> None:
        """Release the reservation, if any."""

    def answerError(status: int, reason: str, retryAfter: int | None = None) -> None:
        """Answer the request with an error the proxy generates itself."""

    def unavailable(reason: str) -> None:
        """Answer 503 with Retry-After: no attempt may follow, for ``reason``."""

    def answerFinal(outcome: IOutcome) -> None:
        """The final permitted attempt failed uncommitted: answer for it."""
