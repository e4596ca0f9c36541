"""What the placement policies need from the rest of the proxy, declared here so that routing
imports nothing of ``dispatch`` (nor of the network): the exchange they drive provides
``IPlacementExchange``, a facade provides ``IFleetView``, an attempt's ending ``IOutcome``,
the request context ``IPlacementContext``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IReactorTime

    from nvpair.proxy.engines import Engine
    from nvpair.proxy.routing.affinity import Affinity
    from nvpair.proxy.routing.candidates import Snapshot
    from nvpair.proxy.routing.nodes import Node
    from nvpair.proxy.routing.reservations import ReservationMap
    from nvpair.proxy.settings import Settings


class IPlacementContext(Interface):
    """What placement reads of the process's request context (``IRequestContext`` extends
    it): the reservations it ranks and takes, and conversation affinity."""

    reservations: ReservationMap = Attribute("The reservation map.")
    affinity: Affinity | None = Attribute(
        "Conversation affinity, or None where it is not ordering candidates (under a "
        "broker, or ``--affinity off``)."
    )


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
    document: dict[str, object] | None = Attribute("The body as admission parsed it, if it did.")
    createdAt: float = Attribute("When the request was admitted (clock seconds).")

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


class IEngineStates(Interface):
    """What standalone placement and the queue read of the engines' own state (spec §10): the
    latest *fresh* probe of each node's engine (slots, loaded models).  A node never probed,
    whose last probe failed, timed out, was malformed or is older than two intervals is
    unknown (``None``), never idle.  Provided in standalone mode only."""

    def freeSlots(nodeId: str) -> int | None:
        """Free slots the engine of ``nodeId`` reported in its latest fresh probe (0 when all
        are busy), or None when unknown or when the engine reports no slots."""

    def totalSlots(nodeId: str) -> int | None:
        """Slots the engine of ``nodeId`` has (reported, or the fleet's configured limit for
        an engine that reports none), or None when unknown."""

    def modelLoaded(nodeId: str, model: str) -> bool | None:
        """Whether the engine of ``nodeId`` has ``model`` loaded now (Ollama ``/api/ps``,
        LM Studio ``/api/v0/models``), or None when it does not say or is unknown."""

    def subscribe(listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(nodeId)`` each time a fresh probe of ``nodeId`` is recorded (room
        may have appeared); returns a function that unsubscribes it."""
