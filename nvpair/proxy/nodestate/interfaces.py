"""The seam through which standalone placement and the queue read the engines' own state
(``IEngineStates``): a leaf, so that the state store, placement and the queue share it
without importing one another."""

from __future__ import annotations

from collections.abc import Callable

from zope.interface import Interface


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
