"""The tracing seam: what the request path calls when ``--otel`` is on.

Nothing here imports OpenTelemetry.  With tracing off the request context's ``tracer`` is
``None`` and an exchange's ``trace`` is ``None``: every call site is one ``is not None``
test, so the request path pays nothing else.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.web.http_headers import Headers
from zope.interface import Interface


class IRequestTrace(Interface):
    """The spans of one client request (``Exchange.trace``): its SERVER span, the queue wait,
    and one CLIENT span per dispatch attempt.  Every method is cheap and never blocks."""

    def queueWaitStarted() -> None:
        """The request starts waiting in a queue for a free slot (a ``queue-wait`` span)."""

    def queueWaitEnded(outcome: str) -> None:
        """The queue wait ended: ``outcome`` names how (e.g. ``dispatched``, ``timeout``,
        ``full``, ``cancelled``); a no-op when no wait is open."""

    def attemptStarted(node: Any, headers: Headers) -> Headers:
        """An attempt on ``node`` (a ``routing.nodes.Node``) starts: open its CLIENT span and
        return a copy of ``headers``, the request headers to send, carrying its context
        (``traceparent``, ``tracestate``)."""

    def attemptFailed(outcome: Any) -> None:
        """The open attempt ended uncommitted (``dispatch.outcome.Failed``)."""

    def committed(nodeId: str, firstByte: float) -> None:
        """The open attempt committed; ``firstByte`` is the time to first byte in seconds."""

    def stalled() -> None:
        """The committed stream was cut by its stall watch."""

    def ended(exchange: Any) -> None:
        """The request ended (its terminal bookkeeping has run): close every open span."""


class IPeerTrace(Interface):
    """The spans of one request from a cluster peer relayed to the local backend."""

    def ended(status: int | None, outcome: str) -> None:
        """The relay ended with the backend's ``status`` (None when none came) and
        ``outcome`` (``completed``, ``truncated``, ``transport``, ``cancelled``)."""


class ITracer(Interface):
    """Starts request traces; the process holds one when ``--otel`` is on."""

    def requestStarted(exchange: Any) -> IRequestTrace:
        """Open the SERVER span of ``exchange`` (a ``dispatch.exchange.Exchange``), continuing
        the client's ``traceparent`` when it sent one."""

    def peerStarted(
        engineId: str, request: Any, headers: Headers, peer: str, backend: str
    ) -> IPeerTrace:
        """Open the spans of a peer request (``request`` is its ``IServerRequest``) relayed
        to ``backend`` and write the backend call's context into ``headers``, its outgoing
        request headers."""

    def shutdown(timeout: float) -> defer.Deferred[None]:
        """Export what is buffered and stop, waiting at most ``timeout`` seconds (off the
        reactor thread)."""
