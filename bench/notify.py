"""In-process micro-benchmark of one request's broker notifications and its statistics.

Per request, exactly as the proxy sends them (``dispatch.Exchange``): ``admit`` (workload
``submitted``, queued and unplaced), ``dispatch`` (``submitted`` placed on the node, then
``discovery:node-activity`` +1), ``serve`` (``started``), the end (``completed`` with stats,
then ``discovery:node-activity`` back to 0): six notifications through the service's
forwarding sink (``SinkSwitch``) into a ``BrokerChannel`` whose transport only counts bytes
(no sockets);
``notify-nullsink`` is the same with a sink that drops everything (the bookkeeping alone, so
``notify`` minus it is the cost of writing the JSON lines).
Separately, ``StatsMeter`` per request: feed + ``result`` for a typical OpenAI non-streaming
body (one chunk) and a 50-event SSE body (one chunk per event).  Rounds alternate the
workloads; prints the median and the best round, and one ``BENCHJSON`` line.

    .venv/bin/python -m bench.notify [--rounds 7] [--requests 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.channel import BrokerChannel, SinkSwitch
from nvpair.proxy.broker.workloads import COMPLETED, WorkloadReporter
from nvpair.proxy.ops.history import History
from nvpair.proxy.routing.stats import StatsMeter
from nvpair.proxy.testing.fakeengine import Answer, Route, document, streamPieces

MODEL = "m1"
NODE = "E"


class CountingTransport:
    """A transport that only counts writes and bytes (the cheapest possible stdout)."""

    def __init__(self) -> None:
        self.writes = 0
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.bytes += len(data)


class _Handler:
    def handle(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        return None


class _NullSink:
    def notify(self, method: str, params: dict[str, Any]) -> None:
        pass


def notifyRun(requests: int, null: bool = False) -> tuple[float, CountingTransport]:
    """Seconds for ``requests`` requests' six notifications each, and the transport; with
    ``null``, the same bookkeeping into a sink that drops everything (no JSON written)."""
    clock = Clock()
    clock.advance(1_700_000_000.25)
    channel = BrokerChannel(_Handler(), lambda: None)  # type: ignore[arg-type]
    transport = CountingTransport()
    channel.transport = transport  # type: ignore[assignment]
    target: Any = _NullSink() if null else channel
    sink = SinkSwitch(target)
    reporter = WorkloadReporter(sink, clock, ends=History(clock))
    activity = Activity(sink)
    stats = {"promptTokens": 12, "completionTokens": 50, "tokensPerSecond": 1234.56, "ttftMs": 3}
    flush = getattr(channel, "flush", None)
    start = time.perf_counter()
    for _ in range(requests):
        workload = reporter.admit("llamacpp", MODEL)
        workload.submitted(NODE)
        activity.change(NODE, +1)
        if flush is not None:
            flush()
        workload.started(NODE)
        if flush is not None:
            flush()
        workload.finish(COMPLETED, None, dict(stats))
        activity.change(NODE, -1)
        if flush is not None:
            flush()
    return time.perf_counter() - start, transport


def statsRun(requests: int, chunks: list[bytes]) -> float:
    """Seconds for ``requests`` meters each fed ``chunks`` and asked for its result."""
    start = time.perf_counter()
    for _ in range(requests):
        meter = StatsMeter("openai", 100.0)
        meter.firstByte(100.01)
        for chunk in chunks:
            meter.feed(chunk)
        meter.result(100.5)
    return time.perf_counter() - start


def statsResultRun(requests: int, chunks: list[bytes]) -> float:
    """Seconds for ``requests`` calls of ``result`` alone on a meter fed ``chunks``."""
    meter = StatsMeter("openai", 100.0)
    meter.firstByte(100.01)
    for chunk in chunks:
        meter.feed(chunk)
    start = time.perf_counter()
    for _ in range(requests):
        meter.result(100.5)
    return time.perf_counter() - start


def _timed(fn: Callable[[], float], requests: int) -> float:
    gc.collect()
    gc.disable()
    try:
        return fn() / requests * 1e6
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args(argv)
    n = args.requests

    plain = [document(Route.CHAT, MODEL, Answer(chunks=50), "bench", 1)]
    sse = streamPieces(Route.CHAT, MODEL, Answer(chunks=50), "bench")
    cases: dict[str, Callable[[], float]] = {
        "notify": lambda: notifyRun(n)[0],
        "notify-nullsink": lambda: notifyRun(n, null=True)[0],
        "stats-plain": lambda: statsRun(n, plain),
        "stats-sse50": lambda: statsRun(n, sse),
        "result-plain": lambda: statsResultRun(n, plain),
        "result-sse50": lambda: statsResultRun(n, sse),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            samples[name].append(_timed(fn, n))
    _, transport = notifyRun(1000)
    print(f"requests per round {n}, rounds {args.rounds}; per request:")
    print(f"  broker writes {transport.writes / 1000:.2f}, bytes {transport.bytes / 1000:.0f}")
    print(
        f"  SSE body {len(sse)} chunks, {sum(map(len, sse))} bytes; "
        f"plain body {len(plain[0])} bytes"
    )
    summary: dict[str, dict[str, float]] = {}
    for name, values in samples.items():
        summary[name] = {"median": statistics.median(values), "best": min(values)}
        print(
            f"  {name:<16} median {summary[name]['median']:7.2f} us   "
            f"best {summary[name]['best']:7.2f} us"
        )
    print("BENCHJSON " + json.dumps({"writes": transport.writes / 1000, "us": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
