"""In-process A/B of the request path with tracing off and on (``--otel``).

One request is a streamed chat through the real ``Exchange`` and ``RequestContext`` (metrics,
history, workloads to a null sink): admitted, dispatched to the one node, committed, three
SSE chunks with usage, ended.  The upstream and the client are the unit tests' fakes, so the
figure is the proxy's own Python work per request, without sockets.  Variants, alternated
in rounds: ``off`` (no tracer), ``1%`` (``parentbased_traceidratio`` 0.01, a batch processor
with an exporter that drops the batch), ``100%`` (every request sampled, same exporter).
Runs against whatever ``nvpair`` is first on ``sys.path``, so the same file measures a
checkout without tracing (``PYTHONPATH=/path/to/checkout``; only ``off`` exists there).
Prints one ``BENCHJSON`` line.

    python -m bench.tracing [--rounds 5] [--requests 20000] [--variants off,1%,100%]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from twisted.internet.task import Clock

from nvpair.proxy.broker.channel import NullSink
from nvpair.proxy.context import RequestContext
from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.engines import RouteClass
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.testing.fakecontext import makeSettings
from nvpair.proxy.testing.upstreamspy import UpstreamSpy
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import CHAT, makeFacade, node

SSE = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)


def makeTracer(clock: Clock, ratio: float) -> tuple[Any, Any]:
    """A tracer sampling ``ratio`` of new traces, batching to an exporter that drops; and
    its provider."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from nvpair.proxy.tracing.spans import SCOPE, Tracer

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return Tracer(provider.get_tracer(SCOPE), clock), provider


def makeContext(variant: str) -> tuple[RequestContext, Any, UpstreamSpy, Any]:
    clock = Clock()
    upstream = UpstreamSpy(clock)
    extra: dict[str, Any] = {}
    provider = None
    if variant != "off":
        extra["tracer"], provider = makeTracer(clock, float(variant.rstrip("%")) / 100)
    context = RequestContext(
        makeSettings(), clock, upstream, NullSink(), Metrics(), LogControl("info"), **extra
    )
    return context, makeFacade(clock, [node("A")]), upstream, provider


def run(variant: str, requests: int) -> float:
    """Microseconds of CPU (all threads: the batch processor's export included) per request
    for ``requests`` requests, the provider's final flush included."""
    context, facade, upstream, provider = makeContext(variant)
    gc.collect()
    started = time.process_time()
    for _ in range(requests):
        request = FakeRequest()
        Exchange(context, facade, request, RouteClass.INFERENCE, "m1", CHAT).start()
        call = upstream.calls.pop()
        response = call.respond(200)
        response.send(SSE, SSE, USAGE)
        response.end()
    if provider is not None:
        provider.shutdown()
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--variants", default="off,1%,100%")
    args = parser.parse_args()
    variants = args.variants.split(",")
    for variant in variants:
        run(variant, 1000)  # warm up
    results: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            results[variant].append(run(variant, args.requests))
    for variant in variants:
        rounds = ", ".join(f"{x:.1f}" for x in results[variant])
        print(f"{variant:>5}: median {statistics.median(results[variant]):.1f} µs ({rounds})")
    summary = {v: round(statistics.median(r), 2) for v, r in results.items()}
    print("BENCHJSON " + json.dumps({"tracing": summary}))


if __name__ == "__main__":
    main()
