"""The seams through which standalone placement, the queue and holds read what is known of
each node: its engine's own state (``IEngineStates``) and its room (``IRoomLedger``).  A
leaf, so that the stores, placement and the queue share them without importing one
another."""

from __future__ import annotations

from collections.abc import Callable

from zope.interface import Interface


class IEngineStates(Interface):
    """What standalone placement reads of the engines' own state (spec §10) besides room:
    the latest *fresh* probe of each node's engine (loaded models) and what its answers
    reported (prefill time).  A node never probed, whose last probe failed, timed out, was
    malformed or is older than two intervals is unknown (``None``), never idle."""

    def modelLoaded(nodeId: str, model: str) -> bool | None:
        """Whether the engine of ``nodeId`` has ``model`` loaded now (Ollama ``/api/ps``,
        LM Studio's models list), or None when it does not say or is unknown."""

    def prefillMs(nodeId: str) -> float | None:
        """The engine of ``nodeId``'s prefill time per evaluated prompt token (ms), or None
        before it reported one."""


class IRoomLedger(Interface):
    """One record per node of the room its engine has for one more of our requests
    (``nodestate.ledger.RoomLedger``, spec §11 "Room"): one rule for *free now* and one for
    *known full*, read alike by placement, the fair queue and holds."""

    def free(nodeId: str) -> int | None:
        """Free slots on ``nodeId`` now (at most 0 when full), or None when unknown."""

    def knownFull(nodeId: str) -> bool:
        """Whether ``nodeId`` is known to have no room now."""

    def capacity(nodeId: str) -> int | None:
        """The most of ours ``nodeId`` can run at once as known now, or None."""

    def serviceTime(nodeId: str) -> float | None:
        """Seconds our requests on ``nodeId`` hold their slot, if seen."""

    def status(nodeId: str) -> dict[str, object]:
        """What ``/status`` shows of ``nodeId``'s room (``slotsAvailable``, ``slotsLimit``,
        ``slotsForeign``, ``learntLimit``, ``serviceSeconds`` where known)."""

    def subscribe(listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(nodeId)`` whenever room may have appeared on ``nodeId``; returns a
        function that unsubscribes it."""
