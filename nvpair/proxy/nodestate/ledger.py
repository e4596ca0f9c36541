"""The room ledger (spec §11 "Room"): one record per node of the room its engine has for one
more of our requests, read alike by placement, the fair queue and holds.

A node's record holds the engine's reported slots (busy and total, from ``/slots`` or
``/metrics``) and when they were read, the *foreign* busy slots derived from them (busy
slots that are not ours: clients reaching the engine directly), our requests running there
now (the process's in-flight count), the limit learnt from *busy* answers, the fleet
file's ``max_concurrency``, and how long our requests there take.

**Free now** is the least of what each known source allows, or None (unknown) when none
applies:

* reported, while the report is fresh (two probe intervals): ``total - foreign - ours``;
* configured (``max_concurrency``): ``limit - ours``;
* learnt from busy answers: ``learnt - ours``;
* learnt from waits, while no fresh report says the slots (Ollama reports none and never
  answers busy: ``parallel``, ``nodestate.concurrency``): ``parallel - ours``.

**Known full**: free now is known and at most 0.

**The probe race.**  An engine counts its busy slots at some instant between the probe's
send and its answer, so our requests that started or ended meanwhile may or may not be in
its count.  With none started or ended while the probe was in flight, ``foreign = busy -
ours`` exactly.  Otherwise foreign lies in ``[busy - ours_at_send - started, busy -
ours_at_send + ended]``: what the previous fresh report proved busy is kept, raised to the
interval's lower bound (exact while the foreign load did not change; a fall waits for a
second report, below), or with no previous report the upper bound (never count a slot free
that may be taken); and the node is marked for an immediate probe.  So a
request sent just before a probe is answered is neither counted twice nor missed.

**A foreign slot frees on two reports.**  A direct client that sends its requests back to
back leaves its slot idle for an instant between them, and a probe landing there reads it
free.  So foreign load only falls when two fresh reports in a row say so: the estimate is
never below what the previous fresh report proved busy (``seen``: exact when settled, the
race's lower bound otherwise).  A slot a direct client really gave up is used one probe
interval later.

**Busy answers** (``isBusyAnswer``): a 429, or a 503 while other requests of ours ran there
and it served one of ours within ``SERVED_RECENTLY`` seconds (Ollama's server-busy; a node
that only refuses is failing, not busy).  The number of ours running there then is learnt
as its limit (one less, at least one, on each further busy answer before it grows: in a
burst some of ours were bouncing too).  It grows by one every ``GROW_EVERY`` seconds without
a busy answer while ours fill it, and is forgotten when it comes due while they do not; a
learnt 0 holds ``BUSY_HOLD`` (or the engine's ``Retry-After``, at most ``MAX_BUSY_HOLD``).

Pure: the clock is read, never scheduled; at most ``MAX_NODES`` records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nvpair.proxy.nodestate.interfaces import IRoomLedger
from nvpair.proxy.nodestate.table import MAX_NODES, BoundedTable

__all__ = [
    "BUSY_HOLD",
    "GROW_EVERY",
    "MAX_BUSY_HOLD",
    "SERVED_RECENTLY",
    "RoomLedger",
    "isBusyAnswer",
]

SERVED_RECENTLY = 60.0
BUSY_HOLD = 1.0
GROW_EVERY = 5.0
MAX_BUSY_HOLD = 30.0
MAX_LISTENERS = 64
SERVICE_WEIGHT = 0.25  # weight of the newest request in the service time's moving average
MAX_SERVICE = 3600.0


def _nothingLearnt(nodeId: str) -> int | None:
    return None


def isBusyAnswer(status: int | None, othersInFlight: int, servedRecently: bool) -> bool:
    """Whether a refused attempt's status says the engine is busy rather than failing: a
    429, or a 503 while we had other requests running on that node and it served one of
    ours within ``SERVED_RECENTLY`` seconds."""
    return status == 429 or (status == 503 and othersInFlight > 0 and servedRecently)


class _Room:
    """One node's record (see the module docstring)."""

    __slots__ = (
        *("total", "foreign", "seen", "readAt", "interval"),
        *("sending", "atSend", "startedInFlight", "endedInFlight", "unsettled"),
        *("configured", "learnt", "growAt", "servedAt", "service", "finished", "busySince"),
    )

    def __init__(self) -> None:
        self.total: int | None = None  # reported slots
        self.foreign: int | None = None  # reported busy slots that are not ours
        self.seen: int | None = None  # the foreign slots the last report proves busy
        self.readAt = 0.0
        self.interval = 0.0
        self.sending = False  # a probe is in flight
        self.atSend = 0  # ours when it was sent
        self.startedInFlight = 0  # ours started, and ended, while it was in flight
        self.endedInFlight = 0
        self.unsettled = False  # the last report raced with ours: probe again now
        self.configured: int | None = None  # max_concurrency
        self.learnt: int | None = None  # learnt from busy answers
        self.growAt = 0.0
        self.servedAt: float | None = None  # when one of ours last committed below 500
        self.service: float | None = None  # seconds ours take there (moving average)
        self.finished = 0  # how many of ours that average has seen
        self.busySince = 0.0  # when ours there last went from none to some


@implementer(IRoomLedger)
class RoomLedger:
    """Every node's room record; ``ours`` is the process's live in-flight count per node
    (``Activity.inFlight``), read, never copied."""

    def __init__(
        self, clock: IReactorTime, ours: Mapping[str, int], maxNodes: int = MAX_NODES
    ) -> None:
        self.clock = clock
        self.ours = ours
        self.rooms: BoundedTable[str, _Room] = BoundedTable(_Room, maxNodes)
        self._listeners: tuple[Callable[[str], None], ...] = ()
        # What an engine reporting no slots serves at once, learnt from its waits (standalone
        # sets it to the residency view's estimator); None where nothing is learnt.
        self.parallel: Callable[[str], int | None] = _nothingLearnt

    # -- events ------------------------------------------------------------------------

    def activityChanged(self, nodeId: str, delta: int) -> None:
        """Our in-flight count on ``nodeId`` changed by ``delta`` (``Activity``'s listener)."""
        room = self.rooms.touch(nodeId)
        if delta > 0 and self.ours.get(nodeId, 0) == delta:
            room.busySince = self.clock.seconds()
        if room.sending:
            if delta > 0:
                room.startedInFlight += delta
            else:
                room.endedInFlight -= delta
        if delta < 0:
            self._roomMayHaveAppeared(nodeId)

    def probeSent(self, nodeId: str) -> None:
        """A probe of ``nodeId``'s slots was sent."""
        room = self.rooms.touch(nodeId)
        room.sending = True
        room.atSend = self.ours.get(nodeId, 0)
        room.startedInFlight = room.endedInFlight = 0

    def probed(self, nodeId: str, busy: int | None, total: int | None, interval: float) -> None:
        """The probe of ``nodeId`` answered: ``busy`` of ``total`` slots (None: not said);
        it stays fresh for two ``interval``\\ s."""
        room = self.rooms.touch(nodeId)
        started, ended = (room.startedInFlight, room.endedInFlight) if room.sending else (0, 0)
        atSend = room.atSend if room.sending else self.ours.get(nodeId, 0)
        now = self.clock.seconds()
        fresh = now - room.readAt <= 2 * room.interval
        previous = room.seen if fresh else None
        room.sending = False
        room.total = total
        room.readAt = now
        room.interval = interval
        if busy is None:
            room.foreign = room.seen = None
        elif not started and not ended:
            room.seen = max(0, busy - atSend)
            room.foreign = room.seen if previous is None else max(room.seen, previous)
            room.unsettled = False
        else:
            room.seen = max(0, busy - atSend - started)
            high = max(0, busy - atSend + ended)
            room.foreign = high if previous is None else max(previous, room.seen)
            room.unsettled = True
        self._roomMayHaveAppeared(nodeId)

    def probeFailed(self, nodeId: str) -> None:
        """The probe of ``nodeId`` failed: its reported slots are unknown from now on."""
        room = self.rooms.touch(nodeId)
        room.sending = room.unsettled = False
        room.total = room.foreign = room.seen = None

    def slotTaken(self, nodeId: str) -> None:
        """One of ours waits in ``nodeId``'s own queue (``flow.enginequeues``): a slot the
        report left free is taken by a client we do not see.  Its foreign load rises by one
        (at most the reported total), as proven busy: it falls on two reports, as any."""
        room = self.rooms.get(nodeId)
        if room is None or room.total is None or room.foreign is None:
            return
        room.foreign = room.seen = min(room.total, room.foreign + 1)

    def configure(self, nodeId: str, limit: int | None) -> None:
        """``nodeId``'s ``max_concurrency`` (None: none)."""
        room = self.rooms.get(nodeId) if limit is None else self.rooms.touch(nodeId)
        if room is not None and room.configured != limit:
            room.configured = limit
            self._roomMayHaveAppeared(nodeId)

    def busyAnswer(self, nodeId: str, status: int | None, retryAfter: float | None) -> bool:
        """An attempt on ``nodeId`` was refused with ``status``: if it is a busy answer
        (``isBusyAnswer``), learn the limit and return True."""
        now = self.clock.seconds()
        room = self.rooms.touch(nodeId)
        others = self.ours.get(nodeId, 0)
        recently = room.servedAt is not None and now - room.servedAt <= SERVED_RECENTLY
        if not isBusyAnswer(status, others, recently):
            return False
        if others > 0 and room.learnt is not None and now < room.growAt:
            others = max(1, min(others, room.learnt) - 1)
        room.learnt = others
        if others > 0:
            room.growAt = now + GROW_EVERY
        else:
            hold = BUSY_HOLD if retryAfter is None else max(BUSY_HOLD, retryAfter)
            room.growAt = now + min(hold, MAX_BUSY_HOLD)
        return True

    def served(self, nodeId: str) -> None:
        """One of ours committed on ``nodeId`` with a status below 500 (not 429)."""
        self.rooms.touch(nodeId).servedAt = self.clock.seconds()

    def finished(self, nodeId: str, seconds: float) -> None:
        """One of ours on ``nodeId`` ended after holding its slot ``seconds``."""
        if not 0 <= seconds <= MAX_SERVICE:
            return
        room = self.rooms.touch(nodeId)
        last = room.service
        room.service = seconds if last is None else last + SERVICE_WEIGHT * (seconds - last)
        if room.finished < 1 << 30:
            room.finished += 1
        self._roomMayHaveAppeared(nodeId)  # how fast it drains is known better now

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left its fleet."""
        self.rooms.pop(nodeId)

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(nodeId)`` whenever room may have appeared on ``nodeId`` (one of
        ours ended there, a probe was read, its limit changed) or how fast it serves ours
        was learnt; returns the unsubscriber."""
        if len(self._listeners) >= MAX_LISTENERS:
            raise ValueError("too many room listeners")
        self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                listeners = list(self._listeners)
                listeners.remove(listener)
                self._listeners = tuple(listeners)

        return unsubscribe

    def changed(self, nodeId: str) -> None:
        """Something that decides where requests may go changed on ``nodeId`` (a model
        finished loading there): tell the listeners, as when room may have appeared."""
        self._roomMayHaveAppeared(nodeId)

    def _roomMayHaveAppeared(self, nodeId: str) -> None:
        for listener in self._listeners:  # a tuple: one that unsubscribes still hears this
            listener(nodeId)

    # -- reads ----------------------------------------------------------------------------

    def free(self, nodeId: str) -> int | None:
        """Free slots on ``nodeId`` now (at most 0 when full), or None when unknown."""
        room = self.rooms.get(nodeId)
        ours = self.ours.get(nodeId, 0)
        reported = least = None  # the least known limit (no list built: read per round)
        if room is not None:
            least = room.configured
            if room.total is not None or room.learnt is not None:  # else both are None
                now = self.clock.seconds()
                reported = self._reported(room, now)
                for limit in (self._learnt(room, ours, now), reported):
                    if limit is not None and (least is None or limit < least):
                        least = limit
        if reported is None:  # an engine that reports its slots is not second-guessed
            parallel = self.parallel(nodeId)
            if parallel is not None and (least is None or parallel < least):
                least = parallel
        return None if least is None else least - ours

    def knownFull(self, nodeId: str) -> bool:
        """Whether ``nodeId`` is known to have no room now."""
        free = self.free(nodeId)
        return free is not None and free <= 0

    def capacity(self, nodeId: str) -> int | None:
        """The most of ours ``nodeId`` can run at once as known now (its free slots plus
        ours there), or None when unknown."""
        free = self.free(nodeId)
        return None if free is None else max(0, free + self.ours.get(nodeId, 0))

    def serviceTime(self, nodeId: str) -> float | None:
        """Seconds our requests on ``nodeId`` hold their slot (a moving average), if seen."""
        room = self.rooms.get(nodeId)
        return None if room is None else room.service

    def serviceAtLeast(self, nodeId: str) -> float | None:
        """While none of ours has ended on ``nodeId`` and some run there: how long the
        first of them has run, a floor under the service time not yet seen; else None."""
        room = self.rooms.get(nodeId)
        if room is None or room.finished or self.ours.get(nodeId, 0) <= 0:
            return None
        return self.clock.seconds() - room.busySince

    def configured(self, nodeId: str) -> int | None:
        """``nodeId``'s ``max_concurrency``, if the fleet file gives one."""
        room = self.rooms.get(nodeId)
        return None if room is None else room.configured

    def reportsSlots(self, nodeId: str) -> bool:
        """Whether a fresh report of ``nodeId``'s slots is in force (it is read then, and
        nothing learnt of the engine second-guesses it)."""
        room = self.rooms.get(nodeId)
        return room is not None and self._reported(room, self.clock.seconds()) is not None

    def serviceSamples(self, nodeId: str) -> int:
        """How many of our requests on ``nodeId`` the service time has seen (capped)."""
        room = self.rooms.get(nodeId)
        return 0 if room is None else room.finished

    def wakeAt(self, nodeId: str) -> float:
        """When ``nodeId``'s learnt limit next grows or lapses (0 when it has none)."""
        room = self.rooms.get(nodeId)
        return 0.0 if room is None or room.learnt is None else room.growAt

    def unsettled(self, nodeId: str) -> bool:
        """Whether ``nodeId``'s last report raced with our requests (probe it again now)."""
        room = self.rooms.get(nodeId)
        return room is not None and room.unsettled

    def status(self, nodeId: str) -> dict[str, object]:
        """What ``/status`` shows of ``nodeId``'s room (empty when nothing is known)."""
        room = self.rooms.get(nodeId)
        if room is None:
            return {}
        out: dict[str, object] = {}
        free = self.free(nodeId)
        if free is not None:
            out["slotsAvailable"] = max(0, free)
        if self._reported(room, self.clock.seconds()) is not None:
            out["slotsForeign"] = room.foreign
        if room.configured is not None:
            out["slotsLimit"] = room.configured
        if room.learnt is not None:
            out["learntLimit"] = room.learnt
        parallel = self.parallel(nodeId)
        if parallel is not None:
            out["learntParallel"] = parallel
        if room.service is not None:
            out["serviceSeconds"] = round(room.service, 3)
        return out

    def _reported(self, room: _Room, now: float) -> int | None:
        """Slots not taken by others, from a fresh report (None when there is none)."""
        if room.total is None or room.foreign is None or now - room.readAt > 2 * room.interval:
            return None
        return room.total - room.foreign

    def _learnt(self, room: _Room, ours: int, now: float) -> int | None:
        """The learnt limit at ``now``: grown by one when due while ours fill it, forgotten
        when due while they do not."""
        if room.learnt is not None and now >= room.growAt:
            if ours < room.learnt:
                room.learnt = None
            else:
                room.learnt += 1
                room.growAt = now + GROW_EVERY
        return room.learnt
