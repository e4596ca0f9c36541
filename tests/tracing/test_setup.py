"""Turning traces on and off: the ``OTEL_*`` environment as the SDK reads it, the bounded
flush at stop, nothing of OpenTelemetry imported when off, and ``--otel`` without the extra."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nvpair.proxy.tracing.setup import (
    ATTRIBUTE_LENGTH,
    boundedFlush,
    exporterFor,
    makeProvider,
    samplerFor,
    spanLimits,
    startTracing,
)


class _Exporter(SpanExporter):
    """Counts exported spans; blocks each export until ``release`` is set, when asked to."""

    def __init__(self, block: bool = False) -> None:
        self.exported: list[str] = []
        self.release = threading.Event()
        if not block:
            self.release.set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        self.exported.extend(s.name for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


class _FromThreads:
    """``callFromThread`` that runs the call and sets ``called`` (the test waits on it)."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.calls: list[Callable[..., object]] = []

    def callFromThread(self, f: Callable[..., object], *args: object, **kw: object) -> None:
        self.calls.append(f)
        self.called.set()


class EnvironmentTests(SynchronousTestCase):
    """The SDK reads its own variables; we add only a default service name."""

    def test_serviceName(self) -> None:
        """No ``OTEL_SERVICE_NAME``: ``nvpair-proxy``; set, it wins."""
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("OTEL_SERVICE_NAME", None)
            os.environ.pop("OTEL_RESOURCE_ATTRIBUTES", None)
            provider = makeProvider(_Exporter(), os.environ)
            self.assertEqual(provider.resource.attributes["service.name"], "nvpair-proxy")
            provider.shutdown()
        with mock.patch.dict(os.environ, {"OTEL_SERVICE_NAME": "edge-proxy"}):
            provider = makeProvider(_Exporter(), os.environ)
            self.assertEqual(provider.resource.attributes["service.name"], "edge-proxy")
            provider.shutdown()

    def test_sampler(self) -> None:
        """``OTEL_TRACES_SAMPLER`` and its argument pick the sampler."""
        env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
        with mock.patch.dict(os.environ, env):
            provider = makeProvider(_Exporter(), os.environ)
        description = provider.sampler.get_description()
        self.assertIn("ParentBased", description)
        self.assertIn("0.01", description)
        provider.shutdown()

    def test_protocol(self) -> None:
        """http/protobuf by default, gRPC when the environment says so."""
        http = exporterFor({})
        self.assertIsInstance(http, OTLPSpanExporter)
        grpc = exporterFor({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
        self.assertIsInstance(grpc, GrpcExporter)
        http.shutdown()
        grpc.shutdown()


CLIENT_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def recorded(environ: dict[str, str], traceparent: str | None = None) -> list[ReadableSpan]:
    """The spans a provider made for ``environ`` records for one server span, continuing
    ``traceparent`` when given, with a 1 MiB model name."""
    exporter = InMemorySpanExporter()
    with mock.patch.dict(os.environ, environ):
        for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
            if name not in environ:
                os.environ.pop(name, None)
        provider = makeProvider(_Exporter(), os.environ)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": traceparent} if traceparent else {}
    )
    span = provider.get_tracer("t").start_span(
        "POST /api/chat", context=parent, attributes={"gen_ai.request.model": "m" * (1 << 20)}
    )
    span.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


class SamplerTests(SynchronousTestCase):
    """Whose sampled flag counts (spec §9a, issue 32): ours by default, the client's only
    when the operator picks a parent-based sampler."""

    def test_clientCannotForce(self) -> None:
        """Without ``OTEL_TRACES_SAMPLER`` the ratio decides, whatever the client's flag:
        at 0 a client's sampled ``traceparent`` records nothing; at the default 1 a root
        records; the sampler says which it is."""
        self.assertEqual(recorded({"OTEL_TRACES_SAMPLER_ARG": "0"}, CLIENT_SAMPLED), [])
        self.assertEqual(len(recorded({}, None)), 1)
        self.assertEqual(len(recorded({}, CLIENT_SAMPLED.replace("-01", "-00"))), 1)
        for arg, rate in (("0.25", "0.25"), ("x", "1.0"), ("2", "1.0"), ("nan", "1.0")):
            sampler = samplerFor({"OTEL_TRACES_SAMPLER_ARG": arg})
            assert sampler is not None
            self.assertEqual(sampler.get_description(), f"TraceIdRatioBased{{{rate}}}")

    def test_operatorTrustsParent(self) -> None:
        """``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0: the client's sampled flag
        is followed (the operator's choice); plain ``traceidratio`` at 0 records nothing."""
        trusting = {
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0",
        }
        self.assertEqual(len(recorded(trusting, CLIENT_SAMPLED)), 1)
        self.assertEqual(recorded(trusting, None), [])
        plain = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
        self.assertEqual(recorded(plain, CLIENT_SAMPLED), [])
        self.assertIsNone(samplerFor({"OTEL_TRACES_SAMPLER": "always_on"}))


class LimitTests(SynchronousTestCase):
    """String attributes are cut to ``ATTRIBUTE_LENGTH`` unless the operator set a limit."""

    def test_defaultLimit(self) -> None:
        """A 1 MiB model name is exported as its first 256 characters."""
        [span] = recorded({})
        assert span.attributes is not None
        self.assertEqual(span.attributes["gen_ai.request.model"], "m" * ATTRIBUTE_LENGTH)

    def test_operatorLimit(self) -> None:
        """Either length variable replaces ours: the SDK reads it."""
        for name in ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"):
            with mock.patch.dict(os.environ, {name: "1000"}):
                self.assertEqual(spanLimits(os.environ).max_span_attribute_length, 1000)
                [span] = recorded({name: "1000"})
            assert span.attributes is not None
            self.assertEqual(len(str(span.attributes["gen_ai.request.model"])), 1000, name)
        self.assertEqual(spanLimits({}).max_span_attribute_length, ATTRIBUTE_LENGTH)


class FlushTests(SynchronousTestCase):
    """The stop's flush runs off the reactor thread and is bounded in time."""

    def test_flushExports(self) -> None:
        """Buffered spans are exported, then the reactor is told (from the flush thread)."""
        exporter = _Exporter()
        fromThreads = _FromThreads()
        clock = Clock()
        tracer = startTracing(fromThreads, clock, {}, exporter)  # type: ignore[arg-type]
        tracer.tracer.start_span("one").end()
        done = tracer.shutdown(2.0)
        self.assertTrue(fromThreads.called.wait(30), "the flush thread finished")
        self.assertEqual(exporter.exported, ["one"])
        self.assertFalse(done.called, "fires on the reactor, not on the flush thread")
        fromThreads.calls[0]()
        self.assertTrue(done.called)
        self.assertEqual(clock.getDelayedCalls(), [], "the deadline timer is cancelled")

    def test_flushBounded(self) -> None:
        """An export that never ends: the stop goes on after the timeout all the same."""
        exporter = _Exporter(block=True)
        self.addCleanup(exporter.release.set)
        fromThreads = _FromThreads()
        clock = Clock()
        provider = makeProvider(exporter, {})
        provider.get_tracer("t").start_span("stuck").end()
        flush = boundedFlush(provider, fromThreads, clock)  # type: ignore[arg-type]
        done = flush(1.5)
        clock.advance(1.4)
        self.assertFalse(done.called)
        clock.advance(0.1)
        self.assertTrue(done.called)


def _script(body: str) -> str:
    return (
        "import sys\n"
        "from nvpair.proxy.options import Options\n"
        "from nvpair.proxy import tap\n" + body
    )


OTEL_MODULES = (
    "o = Options(environ=dict(ENV))\n"
    "o.parseOptions(['--standalone', '--backend', 'llamacpp=http://127.0.0.1:9', *ARGS])\n"
    "service = tap.makeService(o)\n"
    "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry')))\n"
)

BLOCKED = (
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'opentelemetry':\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "Options(environ=dict(ENV)).parseOptions(['--standalone', *ARGS])\n"
)


class ImportTests(TestCase):
    """In a fresh interpreter: what ``--otel`` imports, and its refusal without the extra."""

    timeout = 60

    def spawn(self, script: str, args: Sequence[str], env: dict[str, str]) -> Any:
        code = f"ENV = {env!r}\nARGS = {list(args)!r}\n" + _script(script)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NVPAIR_"))}
        return getProcessOutputAndValue(sys.executable, ["-c", code], env=environ)

    @defer.inlineCallbacks
    def test_offImportsNothing(self):  # type: ignore[no-untyped-def]
        """Without ``--otel`` the whole service is built and no ``opentelemetry`` module is
        loaded; with it, the SDK is (the same script can tell)."""
        out, err, code = yield self.spawn(OTEL_MODULES, [], {})
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), b"")
        out, err, code = yield self.spawn(OTEL_MODULES, ["--otel"], {})
        self.assertEqual(code, 0, err)
        self.assertIn(b"opentelemetry.sdk.trace", out)
        out, err, code = yield self.spawn(OTEL_MODULES, [], {"NVPAIR_PROXY_OTEL": "1"})
        self.assertEqual(code, 0, err)
        self.assertIn(b"opentelemetry.sdk.trace", out, "the environment turns it on too")

    @defer.inlineCallbacks
    def test_missingExtra(self):  # type: ignore[no-untyped-def]
        """``--otel`` (or the variable) without OpenTelemetry installed: exit 2, one line
        saying to install the extra."""
        for args, env in ((["--otel"], {}), ([], {"NVPAIR_PROXY_OTEL": "true"})):
            out, err, code = yield self.spawn(BLOCKED, args, env)
            self.assertEqual(code, 2, err)
            lines = err.decode().strip().splitlines()
            self.assertEqual(len(lines), 1, lines)
            self.assertIn("--otel", lines[0])
            self.assertIn("pip install 'nvpair-proxy[otel]'", lines[0])
        out, err, code = yield self.spawn(BLOCKED, [], {})
        self.assertEqual(code, 0, err)
