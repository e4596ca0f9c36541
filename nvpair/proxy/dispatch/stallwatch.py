"""Cutting a committed stream whose engine went silent (``--stream-idle-timeout``, spec §6).

``StallWatch`` stands between one committed body's transport and the client's flow control
(it is the producer ``ClientFlow`` drives).  Nothing runs per chunk, and no timer belongs
to a stream: the exchange already counts the bytes it relays (``written``), and the
process's one ``StallWatches`` timer, every eighth of the timeout while any stream is
watched, compares each stream's count with the one it saw last.  A change, or a pause the
proxy itself imposed on the engine for a slow client, restarts that stream's idle clock;
once the clock reaches the timeout the watch logs ``stream-stalled``, counts it, and stops
the upstream read, which closes the engine connection: the body then ends unclean, as if
the engine had died, so the client sees its response cut short and nothing is retried.

The cut comes between ``timeout`` and ``1.25 * timeout`` after the last byte (plus however
late the reactor runs the timer), never sooner.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.interfaces import IExchangeReport, IStallWatch, IStallWatches

CHECKS_PER_TIMEOUT = 8


class Flow(Enum):
    """The client's flow control of a watched body, as far as the idle clock cares."""

    FLOWING = "flowing"  # the engine may send; silence counts
    PAUSED = "paused"  # the proxy holds the engine back for a slow client; silence is ours
    RESUMED = "resumed"  # let go again since the last check: the clock restarts there


FLOWING: Final = Flow.FLOWING
PAUSED: Final = Flow.PAUSED
RESUMED: Final = Flow.RESUMED


@implementer(IStallWatches)
class StallWatches:
    """The process's stream idle watches and the one timer that checks them."""

    def __init__(self, clock: IReactorTime, timeout: float) -> None:
        self.clock = clock
        self.timeout = timeout
        self.step = timeout / CHECKS_PER_TIMEOUT
        self._watches: set[StallWatch] = set()
        self._timer: IDelayedCall | None = None
        self._due = 0.0  # when the running timer was meant to fire

    def watch(
        self, upstream: IPushProducer, exchange: IExchangeReport, nodeId: str
    ) -> StallWatch | None:
        """A watch for one committed body (not yet started), or None when the timeout is 0."""
        if self.timeout <= 0:
            return None
        return StallWatch(self, upstream, exchange, nodeId)

    def add(self, watch: StallWatch) -> None:
        """Check ``watch`` from the next tick on."""
        self._watches.add(watch)
        if self._timer is None:
            self._due = self.clock.seconds() + self.step
            self._timer = self.clock.callLater(self.step, self._tick)

    def discard(self, watch: StallWatch) -> None:
        """Stop checking ``watch`` (the timer stops by itself once none is left)."""
        self._watches.discard(watch)

    def __len__(self) -> int:
        return len(self._watches)

    def _tick(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        for watch in list(self._watches):
            watch.check(now)
        if self._watches:
            # Ticks stay on their grid: a late tick does not push the next ones later.
            self._due = max(self._due + self.step, now)
            self._timer = self.clock.callLater(self._due - now, self._tick)


@implementer(IStallWatch)
class StallWatch:
    """The idle watch of one committed body, wrapping that body's producer."""

    __slots__ = (
        "_watches",
        "_upstream",
        "_exchange",
        "_nodeId",
        "_seen",
        "_quietSince",
        "_flow",
        "_over",
    )

    log = Logger()

    def __init__(
        self,
        watches: StallWatches,
        upstream: IPushProducer,
        exchange: IExchangeReport,
        nodeId: str,
    ) -> None:
        self._watches = watches
        self._upstream = upstream
        self._exchange = exchange
        self._nodeId = nodeId
        self._seen = -1  # the first check counts as progress: the clock starts there
        self._quietSince = 0.0
        self._flow: Flow = FLOWING
        self._over = False

    def start(self) -> None:
        """Start watching (the response has just committed)."""
        if not self._over:
            self._watches.add(self)

    def stop(self) -> None:
        """The body ended or was cancelled: stop watching."""
        self._over = True
        self._watches.discard(self)

    def check(self, now: float) -> None:
        """One tick: note progress (bytes relayed, or a pause of ours), or cut when the
        engine has been silent for the whole timeout."""
        written = self._exchange.written
        flow = self._flow
        if written != self._seen or flow is not FLOWING:
            self._seen = written
            self._quietSince = now
            if flow is RESUMED:
                self._flow = FLOWING
            return
        idle = now - self._quietSince
        timeout = self._watches.timeout
        if idle < timeout * (1 - 1e-9):  # ticks a timeout apart may sum a hair short of it
            return
        self.stop()
        exchange = self._exchange
        engineId = exchange.engine.id
        workload = exchange.workload
        self.log.warn(
            "stream-stalled",
            engine=engineId,
            node=self._nodeId,
            workload=workload.id if workload is not None else None,
            idle=round(idle, 3),
        )
        exchange.context.streamStalled(engineId)
        if exchange.trace is not None:
            exchange.trace.stalled()
        self._upstream.stopProducing()

    # -- IPushProducer: what the client's flow control asks of the engine ---------------

    def pauseProducing(self) -> None:
        """The client is slow: hold the engine back (its idle clock stops)."""
        self._flow = PAUSED
        self._upstream.pauseProducing()

    def resumeProducing(self) -> None:
        """The client caught up: read the engine again (its idle clock restarts)."""
        self._flow = RESUMED
        self._upstream.resumeProducing()

    def stopProducing(self) -> None:
        """The client is gone: stop reading the engine, and watching it."""
        self.stop()
        self._upstream.stopProducing()
