"""Turning traces on: the SDK's provider, sampler, resource and OTLP exporter from the
standard ``OTEL_*`` environment, and a bounded flush at stop (imported only with ``--otel``).

Everything the SDK reads from the environment it reads itself: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the resource; the service name defaults to ``nvpair-proxy``),
``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (the sampler),
``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` and ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS`` and the rest of the
exporter's variables, ``OTEL_BSP_*`` (the batch processor), ``OTEL_PROPAGATORS``.  The
choices made here are the defaults where those are unset: the exporter's protocol
(``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``,
``http/protobuf`` unless ``grpc``), the sampler (``samplerFor``: a client's sampled flag is
not trusted) and an attribute length limit (``spanLimits``: a client's strings stay small).
The ``BatchSpanProcessor`` exports on its own thread, so ending a span never waits for the
network; its queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``, 2048 spans by default) and
drops spans past it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping

from opentelemetry.sdk.environment_variables import (
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTEL_TRACES_SAMPLER,
    OTEL_TRACES_SAMPLER_ARG,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Sampler, TraceIdRatioBased
from twisted.internet import defer
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime

from nvpair.proxy.tracing.spans import SCOPE, Tracer

DEFAULT_SERVICE = "nvpair-proxy"
ATTRIBUTE_LENGTH = 256
"""The default longest string attribute value (characters; the SDK cuts longer ones)."""


def samplerFor(environ: Mapping[str, str]) -> Sampler | None:
    """The sampler: the operator's ``OTEL_TRACES_SAMPLER`` when set (None: the SDK reads it;
    only its ``parentbased_*`` samplers follow a client's sampled flag), else ours
    **(choice)**: ``traceidratio`` at ``OTEL_TRACES_SAMPLER_ARG`` (default 1; a value that
    is not a number from 0 to 1 counts as 1, as in the SDK), which decides by the trace id
    alone, so a client cannot force sampling with a sampled ``traceparent``."""
    if environ.get(OTEL_TRACES_SAMPLER, "").strip():
        return None
    try:
        rate = float(environ.get(OTEL_TRACES_SAMPLER_ARG, "1"))
    except ValueError:
        rate = 1.0
    return TraceIdRatioBased(rate if 0.0 <= rate <= 1.0 else 1.0)


def spanLimits(environ: Mapping[str, str]) -> SpanLimits:
    """The SDK's limits, with string attribute values cut to ``ATTRIBUTE_LENGTH`` unless the
    operator set a length limit (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` or
    ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, which the SDK then reads) **(choice)**."""
    if environ.get(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT) or environ.get(
        OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT
    ):
        return SpanLimits()
    return SpanLimits(max_attribute_length=ATTRIBUTE_LENGTH)


def exporterFor(environ: Mapping[str, str]) -> SpanExporter:
    """The OTLP span exporter the environment asks for (its own variables configure it)."""
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def makeProvider(exporter: SpanExporter, environ: Mapping[str, str]) -> TracerProvider:
    """A provider with the environment's resource, our sampler and limits unless the
    environment sets them, batching to ``exporter``."""
    resource = Resource.create({})
    # Cutting long attributes is the point of the limit: the SDK's warning on each cut
    # (through the standard library's logging, straight to stderr) is turned off.
    logging.getLogger("opentelemetry.attributes").setLevel(logging.ERROR)
    if not environ.get("OTEL_SERVICE_NAME") and "service.name=" not in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE}))
    # No atexit hook of the SDK's: an unbounded export at exit would hold the process; the
    # service flushes with a deadline when it stops (``boundedFlush``).
    provider = TracerProvider(
        sampler=samplerFor(environ),
        resource=resource,
        shutdown_on_exit=False,
        span_limits=spanLimits(environ),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def boundedFlush(
    provider: TracerProvider, reactor: IReactorFromThreads, clock: IReactorTime
) -> Callable[[float], defer.Deferred[None]]:
    """A stop for ``provider``: shut it down on a daemon thread (it exports what is
    buffered), firing on the reactor when done or after ``timeout`` seconds, whichever is
    first; the thread never holds the process's exit."""

    def flush(timeout: float) -> defer.Deferred[None]:
        done: defer.Deferred[None] = defer.Deferred()

        def finished() -> None:
            if timer.active():
                timer.cancel()
            if not done.called:
                done.callback(None)

        def run() -> None:
            try:
                provider.force_flush(int(timeout * 1000))
                provider.shutdown()
            finally:
                reactor.callFromThread(finished)

        timer = clock.callLater(timeout, finished)
        threading.Thread(target=run, name="nvpair-trace-flush", daemon=True).start()
        return done

    return flush


def startTracing(
    reactor: IReactorFromThreads,
    clock: IReactorTime,
    environ: Mapping[str, str] = os.environ,
    exporter: SpanExporter | None = None,
) -> Tracer:
    """The process's tracer, exporting over OTLP as the environment says."""
    provider = makeProvider(exporter or exporterFor(environ), environ)
    return Tracer(provider.get_tracer(SCOPE), clock, boundedFlush(provider, reactor, clock))
