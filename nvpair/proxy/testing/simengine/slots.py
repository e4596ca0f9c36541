"""The simulated engine's slots and the bounded FIFO behind them.

An engine decodes at most ``n`` requests at once (llama.cpp's ``-np``; Ollama's
``OLLAMA_NUM_PARALLEL``, per loaded model: ``Core.slotsFor``); the others wait in arrival
order, at most ``queueMax`` of them, and a request beyond that is refused (Ollama's 503
"server busy"). ``hold(k)`` lets a test or a bench take ``k`` slots as clients reaching the
engine directly would: they are taken as they come free, before the queue; held with
``reported=False``, the engine's state endpoints do not show them (a direct client that
arrived after the last probe, frozen there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IReactorTime


@attrs.define(eq=False)
class Job:
    """One request wanting a slot; ``start(slotId)`` runs when it gets one."""

    start: Callable[[int], None]
    arrived: float = 0.0
    slot: int | None = None
    waited: float = 0.0
    task: int = -1


_HELD = "held"


class Slots:
    """``n`` slots and a FIFO of at most ``queueMax`` waiting jobs, timed on ``clock``."""

    def __init__(self, clock: IReactorTime, n: int, queueMax: int) -> None:
        if n < 1:
            raise ValueError("an engine has at least one slot")
        if queueMax < 0:
            raise ValueError("the queue bound cannot be negative")
        self.clock = clock
        self.queueMax = queueMax
        self._owners: list[Job | str | None] = [None] * n
        self._queue: deque[Job] = deque()
        self._holdWanted = 0
        self.holdsReported = True  # whether /slots and /metrics show held slots busy
        self.waits = 0
        self.waitTotal = 0.0
        self.waitMax = 0.0
        self._tasks = 0

    @property
    def total(self) -> int:
        """How many slots the engine has."""
        return len(self._owners)

    @property
    def busy(self) -> int:
        """Slots processing a request or held."""
        return sum(1 for owner in self._owners if owner is not None)

    @property
    def processing(self) -> int:
        """Slots processing one of our requests (not held)."""
        return sum(1 for owner in self._owners if isinstance(owner, Job))

    @property
    def held(self) -> int:
        """Slots held by ``hold``."""
        return sum(1 for owner in self._owners if owner == _HELD)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._queue)

    def isBusy(self, slotId: int) -> bool:
        """Whether slot ``slotId`` is processing or held."""
        return self._owners[slotId] is not None

    def shownBusy(self, slotId: int) -> bool:
        """Whether the engine's state endpoints show slot ``slotId`` busy (a held slot is
        hidden while holds are not reported)."""
        owner = self._owners[slotId]
        return owner is not None and (owner != _HELD or self.holdsReported)

    def jobAt(self, slotId: int) -> Job | None:
        """The job processing in slot ``slotId``, if any."""
        owner = self._owners[slotId]
        return owner if isinstance(owner, Job) else None

    def accepts(self) -> bool:
        """Whether a job submitted now would run or queue (not be refused)."""
        return (self._free() is not None and not self._queue) or len(self._queue) < self.queueMax

    def submit(self, job: Job, bounded: bool = True) -> bool:
        """Start ``job`` in a free slot or queue it; False (nothing done) if the queue is full
        (never when not ``bounded``: a job admitted before it waited for its model)."""
        job.arrived = self.clock.seconds()
        free = self._free()
        if free is not None and not self._queue:
            self._run(job, free)
            return True
        if bounded and len(self._queue) >= self.queueMax:
            return False
        self._queue.append(job)
        return True

    def release(self, job: Job) -> None:
        """``job`` is done or cancelled: free its slot (or take it off the queue)."""
        if job.slot is None:
            try:
                self._queue.remove(job)
            except ValueError:
                pass
            return
        if self._owners[job.slot] is job:
            self._owners[job.slot] = None
        self._fill()

    def hold(self, k: int, reported: bool = True) -> None:
        """Hold ``k`` slots (taken as they come free, before the queue); 0 gives them back.
        Not ``reported``, the state endpoints do not show them."""
        self.holdsReported = reported
        self._holdWanted = max(0, min(k, self.total))
        excess = self.held - self._holdWanted
        for i, owner in enumerate(self._owners):
            if excess <= 0:
                break
            if owner == _HELD:
                self._owners[i] = None
                excess -= 1
        self._fill()

    def resetWaits(self) -> None:
        """Forget the queue waits measured so far."""
        self.waits, self.waitTotal, self.waitMax = 0, 0.0, 0.0

    def _free(self) -> int | None:
        for i, owner in enumerate(self._owners):
            if owner is None:
                return i
        return None

    def _fill(self) -> None:
        while True:
            free = self._free()
            if free is None:
                return
            if self.held < self._holdWanted:
                self._owners[free] = _HELD
            elif self._queue:
                self._run(self._queue.popleft(), free)
            else:
                return

    def _run(self, job: Job, slotId: int) -> None:
        job.slot = slotId
        self._tasks += 1
        job.task = self._tasks
        job.waited = self.clock.seconds() - job.arrived
        self._owners[slotId] = job
        self.waits += 1
        self.waitTotal += job.waited
        self.waitMax = max(self.waitMax, job.waited)
        job.start(slotId)
