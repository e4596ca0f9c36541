"""The request context's hooks, fanned out to observers (as ``twisted.logger``'s publisher
loops over its observers): one fan-out, used by the process's context and by the testing
kit's fake alike, so the two cannot drift.

A request reports four things to its context: an attempt failed uncommitted, a response
committed, the request ended, a committed stream was cut for silence.  Each observer (the
metrics, the traffic history, the traces, standalone's queue and cache accounting, a test's
recorder) takes the ones it cares about; a feature that is off has no observer, so the
request path tests nothing for it.  Every call is guarded: an observer that raises is
logged once per observer and hook, counted, and the others still hear the event, so no
engine answer can break monitoring for later requests.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.interfaces import IAttemptReport, IExchangeReport, IRequestObserver

__all__ = ["HOOKS", "ObservedContext", "RequestObserver", "TraceObserver"]

HOOKS = ("attemptFailed", "committed", "requestEnded", "streamStalled")
MAX_OBSERVERS = 32


@implementer(IRequestObserver)
class RequestObserver:
    """An observer of requests; each hook does nothing unless a subclass says otherwise."""

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt of ``exchange`` ended without committing, as ``outcome`` says."""

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        """``exchange`` committed its response on ``nodeId``, ``firstByte`` seconds after
        it was admitted."""

    def requestEnded(self, exchange: IExchangeReport) -> None:
        """``exchange`` ended; its terminal bookkeeping has run."""

    def streamStalled(self, engineId: str) -> None:
        """A committed stream of ``engineId`` was cut: its engine went silent too long."""


class TraceObserver(RequestObserver):
    """Feeds each exchange's trace (``--otel``): its attempts, commit and end."""

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        if exchange.trace is not None:
            exchange.trace.attemptFailed(outcome)

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        if exchange.trace is not None:
            exchange.trace.committed(nodeId, firstByte)

    def requestEnded(self, exchange: IExchangeReport) -> None:
        if exchange.trace is not None:
            exchange.trace.ended(exchange)


class ObservedContext:
    """The hooks of ``interfaces.IRequestContext``, fanned out to ``observers`` in the
    order they were added; a raising observer is reported through ``hookFailed``.  Each
    hook loops only over the observers that define it (one that keeps
    ``RequestObserver``'s do-nothing method never hears it: it would do nothing)."""

    log = Logger()

    def __init__(self, hookFailed: Callable[[str], None] = lambda hook: None) -> None:
        self.observers: list[IRequestObserver] = []
        self.hookFailed = hookFailed
        self._logged: set[tuple[str, str]] = set()  # (observer class, hook) logged once
        self._hearing: dict[str, list[IRequestObserver]] = {hook: [] for hook in HOOKS}

    def observe(self, observer: IRequestObserver) -> None:
        """Add ``observer``; it hears every later event."""
        if len(self.observers) >= MAX_OBSERVERS:
            raise ValueError("too many request observers")
        self.observers.append(observer)
        for hook, hearing in self._hearing.items():
            if _defines(observer, hook):
                hearing.append(observer)

    def _failed(self, observer: IRequestObserver, hook: str) -> None:
        self.hookFailed(hook)
        key = (type(observer).__name__, hook)
        if key not in self._logged:  # a bounded set: observer classes times four hooks
            self._logged.add(key)
            self.log.failure("hook-failed", observer=key[0], hook=hook)

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt ended uncommitted."""
        for observer in self._hearing["attemptFailed"]:
            try:
                observer.attemptFailed(exchange, outcome)
            except Exception:
                self._failed(observer, "attemptFailed")

    def committed(self, exchange: IExchangeReport, nodeId: str) -> None:
        """A response committed on ``nodeId``."""
        firstByte = exchange.context.clock.seconds() - exchange.createdAt
        for observer in self._hearing["committed"]:
            try:
                observer.committed(exchange, nodeId, firstByte)
            except Exception:
                self._failed(observer, "committed")

    def requestEnded(self, exchange: IExchangeReport) -> None:
        """An exchange ended (its terminal bookkeeping has run)."""
        for observer in self._hearing["requestEnded"]:
            try:
                observer.requestEnded(exchange)
            except Exception:
                self._failed(observer, "requestEnded")

    def streamStalled(self, engineId: str) -> None:
        """A committed stream was cut by its stall watch."""
        for observer in self._hearing["streamStalled"]:
            try:
                observer.streamStalled(engineId)
            except Exception:
                self._failed(observer, "streamStalled")


def _defines(observer: IRequestObserver, hook: str) -> bool:
    """Whether ``observer``'s ``hook`` does something: anything but ``RequestObserver``'s
    own do-nothing method."""
    method = getattr(observer, hook)
    return getattr(method, "__func__", None) is not getattr(RequestObserver, hook)
