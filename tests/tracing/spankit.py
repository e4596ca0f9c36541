"""Span capture for the tracing tests: a ``Tracer`` over an SDK provider whose spans end up in
an ``InMemorySpanExporter`` at once (``SimpleSpanProcessor``), sampling everything."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from twisted.internet.task import Clock

from nvpair.proxy.tracing.spans import SCOPE, Tracer


class SpanCapture:
    """A tracer on ``clock`` and the spans it ended."""

    def __init__(self, clock: Clock, sampler: Sampler = ALWAYS_ON) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = Tracer(self.provider.get_tracer(SCOPE), clock)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def server(self) -> ReadableSpan:
        [span] = [s for s in self.spans() if s.kind.name == "SERVER"]
        return span


__all__ = ["ALWAYS_OFF", "SpanCapture"]
