"""Whether an owner is known to be full (spec §11 "The queue"): pure policy on a clock.

A node is *known full* when any of these says so, and otherwise has room:

* the engine's own state (``IEngineStates``, standalone only): its slot limit reached by
  our requests in flight, or its latest fresh probe's free slots, less the requests we
  started and plus those we ended since that probe, at or below zero;
* a recent *busy* answer from it (429, or 503 while another of our requests ran there:
  Ollama's server-busy), for ``BUSY_HOLD`` seconds (longer when the engine's
  ``Retry-After`` asked, at most ``MAX_BUSY_HOLD``); meanwhile each of our requests that
  ends there frees one slot, for one request.

With neither, nothing is known full and requests go straight to the engines as before.
Per-node state is bounded by ``MAX_NODES`` (the least recently touched node forgotten).
"""

from __future__ import annotations

from collections import OrderedDict

from nvpair.proxy.routing.interfaces import IEngineStates

__all__ = ["BUSY_HOLD", "MAX_BUSY_HOLD", "MAX_NODES", "RoomBoard", "isBusyAnswer"]

BUSY_HOLD = 1.0
MAX_BUSY_HOLD = 30.0
MAX_NODES = 1024


def isBusyAnswer(status: int | None, othersInFlight: int) -> bool:
    """Whether a refused attempt's status says the engine is busy rather than failing: a
    429, or a 503 while we had other requests running on that node."""
    return status == 429 or (status == 503 and othersInFlight > 0)


class _NodeRoom:
    __slots__ = ("busyUntil", "sinceProbe", "freed")

    def __init__(self) -> None:
        self.busyUntil = 0.0
        self.sinceProbe = 0  # our requests started less those ended since the last probe
        self.freed = 0  # slots ours freed on a busy node, not yet taken again


class RoomBoard:
    """Known-full judgement per node, from engine state and busy answers."""

    def __init__(self, states: IEngineStates | None) -> None:
        self.states = states
        self._nodes: OrderedDict[str, _NodeRoom] = OrderedDict()

    def _node(self, nodeId: str) -> _NodeRoom:
        node = self._nodes.get(nodeId)
        if node is None:
            node = self._nodes[nodeId] = _NodeRoom()
            while len(self._nodes) > MAX_NODES:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(nodeId)
        return node

    def __len__(self) -> int:
        return len(self._nodes)

    def started(self, nodeId: str) -> None:
        """One of our requests started on ``nodeId``."""
        node = self._node(nodeId)
        node.sinceProbe += 1
        if node.freed > 0:
            node.freed -= 1

    def ended(self, nodeId: str) -> None:
        """One of our requests on ``nodeId`` ended: a slot is free again."""
        node = self._node(nodeId)
        node.sinceProbe -= 1
        if node.busyUntil > 0.0:
            node.freed += 1  # one slot: one request may go there

    def probed(self, nodeId: str) -> None:
        """A fresh probe of ``nodeId`` was recorded: it counts everything started before."""
        self._node(nodeId).sinceProbe = 0

    def busy(self, nodeId: str, now: float, retryAfter: float | None) -> None:
        """``nodeId`` answered busy; it counts as full for a while."""
        hold = BUSY_HOLD if retryAfter is None else max(BUSY_HOLD, retryAfter)
        node = self._node(nodeId)
        node.busyUntil = now + min(hold, MAX_BUSY_HOLD)
        node.freed = 0

    def busyUntil(self, nodeId: str) -> float:
        """When ``nodeId``'s busy mark lapses (0 when none)."""
        node = self._nodes.get(nodeId)
        return 0.0 if node is None else node.busyUntil

    def hasRoom(self, nodeId: str, inFlight: int, now: float) -> bool:
        """Whether ``nodeId`` is not known full; ``inFlight`` is our requests running there."""
        node = self._nodes.get(nodeId)
        if node is not None and node.busyUntil > now and node.freed <= 0:
            return False
        states = self.states
        if states is None:
            return True
        total = states.totalSlots(nodeId)
        if total is not None and inFlight >= total:
            return False
        free = states.freeSlots(nodeId)
        if free is None:
            return True
        since = 0 if node is None else node.sinceProbe
        return free - since > 0
