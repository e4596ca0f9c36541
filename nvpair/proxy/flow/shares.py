"""Start-time fair queueing over named shares (spec §11 "The queue"): the service tags of
one level of the fair queue, no requests.  Pure.

Each share carries a virtual start tag: the tag its next request starts at.  A dispatch
advances its share's tag by ``1 / weight`` and moves the level's virtual time to the start
tag it used.  A share that starts waiting again resumes at ``max(its tag, virtual time -
IDLE_CREDIT)``: idle time banks at most one request's credit, so a share sending one
request at a time (idle while it is served) goes before a backlogged one it has not
out-served, and a long-idle one cannot take a run.

A share never seen before starts at the virtual time, or, with ``newBehind``, one step
behind the largest tag of the shares waiting now: where shares are keys a client picks
(every unverified key), a fresh key must not be a fresh claim to service, or an app that
sends a new key with each request would be served ahead of everyone.

Bounded: at most ``MAX_IDLE`` idle shares' tags are kept, the oldest forgotten first (a
forgotten share is a share never seen).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["IDLE_CREDIT", "MAX_IDLE", "Shares"]

IDLE_CREDIT = 1.0
MAX_IDLE = 1024


class Shares:
    """The service tags of the shares of one level: those waiting and the recently idle."""

    def __init__(self, newBehind: bool = False, maxIdle: int = MAX_IDLE) -> None:
        self.newBehind = newBehind
        self.maxIdle = maxIdle
        self.virtual = 0.0
        self.active: dict[str, float] = {}  # waiting shares' start tags
        self._charged: OrderedDict[str, int] = OrderedDict()  # dispatches, capped at 2
        self._idle: OrderedDict[str, float] = OrderedDict()  # idle shares, oldest first

    def __len__(self) -> int:
        """Shares with service state held (waiting or idle)."""
        return len(self.active) + len(self._idle)

    def _fresh(self) -> float:
        if self.newBehind and self.active:
            return max(self.virtual, max(self.active.values()) + 1.0)
        return self.virtual

    def regular(self, share: str) -> bool:
        """Whether ``share`` was charged more than one dispatch lately (a key minted per
        request has at most its one request's, even when it bounced off a busy engine)."""
        return self._charged.get(share, 0) > 1

    def tag(self, share: str) -> float:
        """The tag ``share``'s next request would start at."""
        tag = self.active.get(share)
        if tag is not None:
            return tag
        idle = self._idle.get(share)
        if idle is None:
            return self._fresh()
        floor = self.virtual - IDLE_CREDIT
        return floor if floor > idle else idle

    def waiting(self, share: str) -> None:
        """``share`` has requests waiting now (idempotent)."""
        if share not in self.active:
            self.active[share] = self.tag(share)
            self._idle.pop(share, None)

    def idle(self, share: str) -> None:
        """Nothing of ``share`` waits any more: its tag is kept, bounded."""
        tag = self.active.pop(share, None)
        if tag is not None:
            self._keep(share, tag)

    def charge(self, share: str, weight: float = 1.0) -> None:
        """``share`` was dispatched one request: its tag advances by ``1 / weight`` from
        the start tag it used, and the virtual time moves to that start tag."""
        start = self.tag(share)
        if start > self.virtual:
            self.virtual = start
        charged = self._charged
        charged[share] = 2 if charged.pop(share, 0) else 1  # capped at 2
        if len(charged) > self.maxIdle:
            charged.popitem(last=False)
        tag = start + 1.0 / weight
        if share in self.active:
            self.active[share] = tag
        else:
            self._keep(share, tag)

    def _keep(self, share: str, tag: float) -> None:
        idle = self._idle
        idle[share] = tag
        idle.move_to_end(share)
        while len(idle) > self.maxIdle:
            idle.popitem(last=False)
