"""The tracing seam: what the request path calls when ``--otel`` is on.

Nothing here imports OpenTelemetry.  With tracing off the request context's ``tracer`` is
``None`` and an exchange's ``trace`` is ``None``: every call site is one ``is not None``
test, so the request path pays nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import attrs
from twisted.internet import defer
from twisted.web.http_headers import Headers
from zope.interface import Interface

from nvpair.proxy.endings import BodyEnding, FailureKind

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node


@attrs.frozen
class TraceStart:
    """What a trace records of a request when it starts: its method and path, the client's
    headers (their ``traceparent`` is continued), the facade's engine, and for a client
    request whether it is inference, the model it names and when it was admitted."""

    method: bytes
    path: bytes
    headers: Headers = attrs.field(eq=False)
    engineId: str
    inference: bool = False
    model: str | None = None
    createdAt: float = 0.0


class FailedAttempt(Protocol):
    """What a trace reads of an attempt that failed (``dispatch.outcome.Failed``)."""

    @property
    def kind(self) -> FailureKind: ...
    @property
    def status(self) -> int | None: ...


class TracedEnd(Protocol):
    """What a trace reads of a request that ended (``dispatch.exchange.Exchange``)."""

    @property
    def attempts(self) -> int: ...
    @property
    def committedStatus(self) -> int | None: ...
    @property
    def ending(self) -> BodyEnding | None: ...
    @property
    def servedBy(self) -> str | None: ...
    @property
    def clientGone(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def workload(self) -> TracedWorkload | None: ...


class TracedWorkload(Protocol):
    """What a trace reads of a request's workload: the statistics it ended with."""

    @property
    def stats(self) -> Mapping[str, object] | None: ...


class IRequestTrace(Interface):
    """The spans of one client request (``Exchange.trace``): its SERVER span, the queue wait,
    and one CLIENT span per dispatch attempt.  Every method is cheap and never blocks."""

    def queueWaitStarted() -> None:
        """The request starts waiting in a queue for a free slot (a ``queue-wait`` span)."""

    def queueWaitEnded(outcome: str) -> None:
        """The queue wait ended: ``outcome`` names how (e.g. ``dispatched``, ``timeout``,
        ``full``, ``cancelled``); a no-op when no wait is open."""

    def attemptStarted(node: Node, headers: Headers) -> Headers:
        """An attempt on ``node`` starts: open its CLIENT span and return the request
        headers to send: a copy of ``headers`` carrying its context (``traceparent``,
        ``tracestate``); ``headers`` themselves are never written."""

    def attemptFailed(outcome: FailedAttempt) -> None:
        """The open attempt ended uncommitted."""

    def committed(nodeId: str, firstByte: float) -> None:
        """The open attempt committed; ``firstByte`` is the time to first byte in seconds."""

    def stalled() -> None:
        """The committed stream was cut by its stall watch."""

    def ended(exchange: TracedEnd) -> None:
        """The request ended (its terminal bookkeeping has run): close every open span."""


class IPeerTrace(Interface):
    """The spans of one request from a cluster peer relayed to the local backend."""

    def ended(status: int | None, outcome: str) -> None:
        """The relay ended with the backend's ``status`` (None when none came) and
        ``outcome`` (``completed``, ``truncated``, ``transport``, ``cancelled``)."""


class ITracer(Interface):
    """Starts request traces; the process holds one when ``--otel`` is on."""

    def requestStarted(start: TraceStart) -> IRequestTrace:
        """Open the SERVER span of a client request, continuing the client's
        ``traceparent`` when it sent one."""

    def peerStarted(start: TraceStart, outgoing: Headers, peer: str, backend: str) -> IPeerTrace:
        """Open the spans of a peer request relayed to ``backend`` and write the backend
        call's context into ``outgoing``, the request headers the peer door sends (its own
        copy, not the client's)."""

    def shutdown(timeout: float) -> defer.Deferred[None]:
        """Export what is buffered and stop, waiting at most ``timeout`` seconds (off the
        reactor thread)."""
