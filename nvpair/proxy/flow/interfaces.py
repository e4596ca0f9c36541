"""What the request path asks of standalone's flow control (``dispatch.queueing.Queueing``):
declared here, below the request context, so that the context names it without importing
the dispatch layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from nvpair.proxy.flow.clients import Client
    from nvpair.proxy.placement.interfaces import Backlog, IFleetView, IPlacementExchange
    from nvpair.proxy.routing.facts import Identity
    from nvpair.proxy.routing.nodes import Node, OwnerSplit


class QueueRefusal(Enum):
    """Why the queue answered a request 503 without sending it: the values are the error
    codes the client reads and the ``reason`` label of the queue's refusal counters."""

    FULL = "queue_full"  # past --queue-max (or its place given to a fairer client)
    TIMEOUT = "queue_timeout"  # waited --queue-timeout
    DEADLINE = "deadline_exceeded"  # its job deadline came first


class IQueueing(Interface):
    """Standalone flow control: the fair queue while every owner is known full, and the
    per-node breakers."""

    def clientOf(authorization: bytes | None, identity: Identity) -> Client:
        """The request's client by protocol §9's rule, with the declared clients in force."""

    def knownFull(owners: Sequence[Node], model: str | None = None) -> bool:
        """Whether every one of ``owners`` is known full now (for ``model``: a node where it
        is loading counts as full)."""

    def loadStarted(facade: IFleetView, model: str) -> None:
        """A request for ``model`` goes to start a load: what its queue waited is paid."""

    def engineWaited(engineId: str, model: str, seconds: float, since: float) -> None:
        """One of ``model``'s requests in the facade of ``engineId``, dispatched at
        ``since``, waited ``seconds`` for a slot inside its engine (the first byte's wait
        beyond the baseline, ``ConcurrencyEstimator.queued``): it counts towards a further
        copy as a wait in the queue does."""

    def backlog(facade: IFleetView, model: str) -> Backlog:
        """How many requests for ``model`` wait in ``facade``'s queue, and what its requests
        waited lately."""

    def waitForRoom(
        ex: IPlacementExchange, owners: Sequence[Node], client: Client
    ) -> Deferred[None] | None:
        """None when ``ex`` may go on now (charged to ``client``); else a Deferred that
        fires when it is dispatched, or fails with ``CancelledError`` once answered."""

    def holdFor(nodeId: str, seconds: float) -> Deferred[None] | None:
        """Hold a request for ``nodeId``'s next free slot, at most ``seconds``: a Deferred
        firing then (cancel it when the client goes), or None when it cannot be held."""

    def crowded() -> bool:
        """Whether requests wait in the proxy (held for a prefix holder, or in a fair
        queue): a slot that frees will be taken by one of them."""

    def demote(owners: Sequence[Node], model: str | None = None) -> OwnerSplit:
        """``owners`` split: those to order as usual, then the known-full ones (while another
        has room; for ``model`` as ``knownFull`` says), then those whose breaker is open."""

    def busyAnswer(nodeId: str, status: int | None, retryAfter: float | None) -> bool:
        """Whether ``nodeId``'s refusal with ``status`` (and the engine's ``Retry-After``
        seconds) says it is busy: its room is learnt, and it is no breaker failure."""

    def nodeFailed(nodeId: str, retryAfter: float | None) -> None:
        """A fast failure that was ``nodeId``'s fault (not the request's): one toward its
        breaker."""

    def committed(nodeId: str, status: int | None) -> None:
        """A response committed on ``nodeId`` with ``status`` (whose fault a 5xx is has been
        decided: the caller does not report one that was the request's)."""


class IMovable(Interface):
    """An attempt that can be given up before any content for its request to be placed
    again (``dispatch.attempt.Attempt``)."""

    node: Node = Attribute("The node the attempt went to.")

    def move() -> bool:
        """Give up the attempt, uncommitted, as moved; False when it is over already."""


class IEngineQueues(Interface):
    """Standalone mode's watch over first attempts that may wait in an engine's own queue
    (``flow.enginequeues.EngineQueues``, spec §11 "Moved before its first token")."""

    def watch(
        attempt: IMovable,
        model: str,
        owners: Callable[[], tuple[Node, ...]],
        bodyBytes: int,
    ) -> None:
        """Watch ``attempt`` (sent now, a body of ``bodyBytes`` for ``model``) until it
        commits or ends; ``owners`` gives the model's owners when it is checked."""

    def discard(attempt: IMovable) -> None:
        """Stop watching ``attempt`` (it committed or ended)."""
