"""Whether an owner is known to be full (spec §11 "The queue"): pure policy on a clock.

A node is *known full* when any of these says so, and otherwise has room:

* the engine's own state (``IEngineStates``, standalone only): its slot limit reached by
  our requests in flight, or its latest fresh probe's free slots, less the requests we
  started and plus those we ended since that probe, at or below zero;
* a *busy* answer from it (429, or 503 while other requests of ours ran there and it
  served one of ours within ``SERVED_RECENTLY`` seconds: Ollama's server-busy): the number
  of ours running there then is learnt as its limit (one less, at least one, on each
  further busy answer before it grows: in a burst some of ours were bouncing too), and it
  is full while ours reach it.  The limit grows by one every ``GROW_EVERY`` seconds
  without a busy answer while ours fill it (additive increase; a learnt 0 waits
  ``BUSY_HOLD``, or the engine's ``Retry-After``, at most ``MAX_BUSY_HOLD``), and is
  forgotten when it comes due while ours do not fill it.

With neither, nothing is known full and requests go straight to the engines as before.
Per-node state is bounded by ``MAX_NODES`` (the least recently touched node forgotten).
"""

from __future__ import annotations

from collections import OrderedDict

from nvpair.proxy.nodestate.interfaces import IEngineStates

__all__ = [
    "BUSY_HOLD",
    "GROW_EVERY",
    "MAX_BUSY_HOLD",
    "MAX_NODES",
    "SERVED_RECENTLY",
    "RoomBoard",
    "isBusyAnswer",
]

SERVED_RECENTLY = 60.0
BUSY_HOLD = 1.0
GROW_EVERY = 5.0
MAX_BUSY_HOLD = 30.0
MAX_NODES = 1024


def isBusyAnswer(status: int | None, othersInFlight: int, servedRecently: bool) -> bool:
    """Whether a refused attempt's status says the engine is busy rather than failing: a
    429, or a 503 while we had other requests running on that node and it served one of
    ours within ``SERVED_RECENTLY`` seconds (a node that only ever refuses is failing, not
    busy, however many of ours bounce off it at once)."""
    return status == 429 or (status == 503 and othersInFlight > 0 and servedRecently)


class _NodeRoom:
    __slots__ = ("limit", "growAt", "sinceProbe")

    def __init__(self) -> None:
        self.limit: int | None = None  # learnt from busy answers
        self.growAt = 0.0
        self.sinceProbe = 0  # our requests started less those ended since the last probe


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
        self._node(nodeId).sinceProbe += 1

    def ended(self, nodeId: str) -> None:
        """One of our requests on ``nodeId`` ended."""
        self._node(nodeId).sinceProbe -= 1

    def probed(self, nodeId: str) -> None:
        """A fresh probe of ``nodeId`` was recorded: it counts everything started before."""
        self._node(nodeId).sinceProbe = 0

    def busy(self, nodeId: str, now: float, retryAfter: float | None, others: int) -> None:
        """``nodeId`` answered busy while ``others`` of ours ran there: its limit."""
        node = self._node(nodeId)
        if others > 0 and node.limit is not None and now < node.growAt:
            # Busy again before the limit grew: some of ``others`` were attempts bouncing
            # too (a burst): one less each time, down to one.
            others = max(1, min(others, node.limit) - 1)
        node.limit = others
        if others > 0:
            node.growAt = now + GROW_EVERY
        else:
            hold = BUSY_HOLD if retryAfter is None else max(BUSY_HOLD, retryAfter)
            node.growAt = now + min(hold, MAX_BUSY_HOLD)

    def wakeAt(self, nodeId: str) -> float:
        """When ``nodeId``'s learnt limit next grows (0 when it has none)."""
        node = self._nodes.get(nodeId)
        return 0.0 if node is None or node.limit is None else node.growAt

    def limit(self, nodeId: str) -> int | None:
        """``nodeId``'s learnt limit, if any."""
        node = self._nodes.get(nodeId)
        return None if node is None else node.limit

    def hasRoom(self, nodeId: str, inFlight: int, now: float) -> bool:
        """Whether ``nodeId`` is not known full; ``inFlight`` is our requests running there."""
        node = self._nodes.get(nodeId)
        if node is not None and node.limit is not None:
            if now >= node.growAt:
                if inFlight < node.limit:
                    node.limit = None  # not used to the full: forget it
                else:
                    node.limit += 1
                    node.growAt = now + GROW_EVERY
            if node.limit is not None and inFlight >= node.limit:
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
