"""Routing the proxy's notifications to the broker's subscribers (protocol §3-§5).

``NotificationRouter`` is the notification half of ``ProxyProcess``: subscriptions by
method name or predicate, and a Deferred for the next matching notification.  A subscriber
that raises is logged and never stops delivery to the others.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from nvpair.supervisor.channel import RequestTimeout

_Subscription = tuple[Callable[[str], bool], Callable[[str, object], None]]


class NotificationRouter:
    """Delivers notifications to subscribers; ``requestTimeout`` is the default wait."""

    _log = Logger()
    requestTimeout: float

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._subscriptions: list[_Subscription] = []

    def subscribe(
        self,
        methodOrPredicate: str | Callable[[str], bool],
        callback: Callable[[str, object], None],
    ) -> Callable[[], None]:
        """Deliver matching notifications as ``callback(method, params)``; return unsubscribe."""
        match: Callable[[str], bool]
        if isinstance(methodOrPredicate, str):
            name = methodOrPredicate
            match = name.__eq__
        else:
            match = methodOrPredicate
        entry = (match, callback)
        self._subscriptions.append(entry)

        def unsubscribe() -> None:
            if entry in self._subscriptions:
                self._subscriptions.remove(entry)

        return unsubscribe

    def nextNotification(
        self,
        method: str,
        predicate: Callable[[object], bool] | None = None,
        timeout: float | None = None,
    ) -> Deferred[object]:
        """Fire with the params of the next ``method`` notification whose params match.

        Fails with ``RequestTimeout`` after ``timeout`` (default ``requestTimeout``).
        """
        limit = self.requestTimeout if timeout is None else timeout

        def cleanup() -> None:
            unsubscribe()
            if timer.active():
                timer.cancel()

        d: Deferred[object] = Deferred(lambda _: cleanup())

        def received(_: str, params: object) -> None:
            if predicate is None or predicate(params):
                cleanup()
                d.callback(params)

        def expire() -> None:
            unsubscribe()
            d.errback(RequestTimeout(method, limit))

        unsubscribe = self.subscribe(method, received)
        timer = self._clock.callLater(limit, expire)
        return d

    def _dispatch(self, method: str, params: object) -> None:
        for match, callback in list(self._subscriptions):
            try:
                if match(method):
                    callback(method, params)
            except Exception:
                self._log.failure("notification subscriber for {method} raised", method=method)
