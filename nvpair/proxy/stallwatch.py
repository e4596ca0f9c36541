"""Cutting a committed stream whose engine went silent (``--stream-idle-timeout``, spec §6).

``StallWatch`` stands between the committed body's transport and the client's flow
control (it is the producer ``ClientFlow`` drives).  Nothing runs per chunk: the exchange
already counts the bytes it relays (``written``), and one timer, firing every quarter of
the timeout, compares that count with the one it saw last.  A change, or a pause the
proxy itself imposed on the engine for a slow client, restarts the idle clock; once the
clock reaches the timeout the watch logs ``stream-stalled``, counts it, and stops the
upstream read, which closes the engine connection: the body then ends unclean, as if the
engine had died, so the client sees its response cut short and nothing is retried.

The cut comes between ``timeout`` and ``1.25 * timeout`` after the last byte, never sooner.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

CHECKS_PER_TIMEOUT = 4


@implementer(IPushProducer)
class StallWatch:
    """The idle watch of one committed body, wrapping that body's producer."""

    __slots__ = ("_upstream", "_exchange", "_nodeId", "_clock", "_timeout", "_step", "_timer",
                 "_seen", "_quietSince", "_paused", "_over", "stalled")

    log = Logger()

    def __init__(self, upstream: IPushProducer, exchange: Any, nodeId: str,
                 timeout: float) -> None:
        self._upstream = upstream
        self._exchange = exchange
        self._nodeId = nodeId
        self._clock = exchange.clock
        self._timeout = timeout
        self._step = timeout / CHECKS_PER_TIMEOUT
        self._timer: IDelayedCall | None = None
        self._seen = -1
        self._quietSince = 0.0
        self._paused = False
        self._over = False
        self.stalled = False

    def start(self) -> None:
        """Start watching (the first byte has just arrived)."""
        if self._over or self._timer is not None:
            return
        self._seen = self._exchange.written
        self._quietSince = self._clock.seconds()
        self._timer = self._clock.callLater(self._step, self._check)

    def stop(self) -> None:
        """The body ended or was cancelled: stop watching."""
        self._over = True
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _check(self) -> None:
        self._timer = None
        if self._over:
            return
        now = self._clock.seconds()
        seen = self._exchange.written
        if seen != self._seen or self._paused:
            self._seen = seen
            self._quietSince = now
        idle = now - self._quietSince
        if idle < self._timeout:
            self._timer = self._clock.callLater(min(self._step, self._timeout - idle),
                                                self._check)
            return
        self._over = True
        self.stalled = True
        exchange = self._exchange
        engineId = exchange.engine.id
        workload = exchange.workload
        self.log.warn("stream-stalled", engine=engineId, node=self._nodeId,
                      workload=workload.id if workload is not None else None,
                      idle=round(idle, 3))
        metrics = getattr(exchange.context, "metrics", None)
        if metrics is not None:
            metrics.streamStalled(engineId)
        self._upstream.stopProducing()

    # -- IPushProducer: what the client's flow control asks of the engine ---------------

    def pauseProducing(self) -> None:
        """The client is slow: hold the engine back (the idle clock stops)."""
        self._paused = True
        self._upstream.pauseProducing()

    def resumeProducing(self) -> None:
        """The client caught up: read the engine again (the idle clock restarts)."""
        self._paused = False
        self._quietSince = self._clock.seconds()
        self._upstream.resumeProducing()

    def stopProducing(self) -> None:
        """The client is gone: stop reading the engine, and watching it."""
        self.stop()
        self._upstream.stopProducing()
