"""Requests held in the proxy for one node's next free slot (spec §11 "Placement").

Placement holds a request (``prefixplace.choose`` gives a ``hold``) when the owner holding
its longest cached prefix is full while another owner has room, and recomputing the
difference there would cost more than a short wait.  Held here, it waits in the proxy
rather than in that engine's own queue: it holds no attempt, reservation or connection,
and stays free to go elsewhere.  Its Deferred fires (with None) as soon as the node has
room (checked whenever the queue drains: an engine probe, one of our requests ending, a
busy mark lapsing) or when its budget runs out (the seconds recomputing would take), and
is cancelled when its client goes.  Per node first come, first served; at most
``maxHeld`` at once (beyond that a request is not held).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

__all__ = ["Holds"]


class _Held:
    __slots__ = ("nodeId", "deferred", "timer")

    def __init__(self, nodeId: str) -> None:
        self.nodeId = nodeId
        self.deferred: defer.Deferred[None]  # set once held: its canceller needs the entry
        self.timer: IDelayedCall | None = None


class Holds:
    """The held requests, per node in arrival order, with their budgets' timers."""

    def __init__(self, clock: IReactorTime, hasRoom: Callable[[str], bool], maxHeld: int) -> None:
        self.clock = clock
        self.hasRoom = hasRoom  # whether a node has room now (the room ledger)
        self.maxHeld = maxHeld
        self._nodes: dict[str, deque[_Held]] = {}
        self._count = 0
        self.endedWithRoom = 0  # holds ended because the node had room
        self.endedWithBudget = 0  # ... because the budget ran out

    def __len__(self) -> int:
        return self._count

    def hold(self, nodeId: str, seconds: float) -> defer.Deferred[None] | None:
        """Hold a request for ``nodeId``'s next free slot, at most ``seconds``: a Deferred
        firing when it has room or the time is up (cancel it when the client goes), or
        None when ``maxHeld`` requests are held already."""
        if self._count >= self.maxHeld:
            return None
        entry = _Held(nodeId)
        entry.deferred = defer.Deferred(lambda _: self._cancel(entry))
        entry.timer = self.clock.callLater(max(0.0, seconds), self._expire, entry)
        self._nodes.setdefault(nodeId, deque()).append(entry)
        self._count += 1
        return entry.deferred

    def release(self) -> None:
        """Let out, first come first, the requests held for nodes that have room now."""
        for nodeId in list(self._nodes):
            while (queue := self._nodes.get(nodeId)) and self.hasRoom(nodeId):
                entry = queue[0]
                self._remove(entry)
                self.endedWithRoom += 1
                entry.deferred.callback(None)  # placed now: it takes the room it found

    def _remove(self, entry: _Held) -> bool:
        """Take ``entry`` out (cancelling its timer); False if it was out already."""
        queue = self._nodes.get(entry.nodeId)
        if queue is None:
            return False
        try:
            queue.remove(entry)
        except ValueError:
            return False
        if not queue:
            del self._nodes[entry.nodeId]
        self._count -= 1
        timer = entry.timer
        entry.timer = None
        if timer is not None and timer.active():
            timer.cancel()
        return True

    def _cancel(self, entry: _Held) -> None:
        self._remove(entry)  # its client went: out, and its Deferred fails as cancelled

    def _expire(self, entry: _Held) -> None:
        entry.timer = None
        if self._remove(entry):
            self.endedWithBudget += 1
            entry.deferred.callback(None)
