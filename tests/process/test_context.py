"""Tests for nvpair.proxy.context (the request context) and the fake the unit tests use."""

from __future__ import annotations

import json

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from zope.interface.verify import verifyObject

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.channel import SinkSwitch
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.context import RequestContext
from nvpair.proxy.dispatch.outcome import Failed
from nvpair.proxy.dispatch.stallwatch import StallWatches
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import LLAMACPP
from nvpair.proxy.interfaces import (
    IActivity,
    IAttemptReport,
    IBrokerSink,
    IExchangeReport,
    IRequestContext,
    IStallWatch,
    IStallWatches,
    IWorkload,
    IWorkloadReporter,
)
from nvpair.proxy.logswitch import ILogControl
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.testing.fakecontext import ExchangeReport, FakeContext, ListSink, makeSettings
from nvpair.proxy.testing.upstreamspy import UpstreamSpy
from tests.support.fakerequest import FakeRequest


class FakeContextTests(SynchronousTestCase):
    """The one fake context provides the interface, with the test's upstream or its own."""

    def test_interface(self) -> None:
        """Both ways of building it provide ``IRequestContext``."""
        self.assertTrue(verifyObject(IRequestContext, FakeContext()))
        upstream = UpstreamSpy(Clock())
        context = FakeContext(upstream=upstream, logLevel="debug", dialTimeout=2.0)
        self.assertTrue(verifyObject(IRequestContext, context))
        self.assertIs(context.upstream, upstream)
        self.assertTrue(context.logControl.enabled("debug"))
        self.assertEqual(context.settings.dialTimeout, 2.0)

    def test_records(self) -> None:
        """Generated errors are answered and recorded; reports are recorded."""
        context = FakeContext()
        request = FakeRequest()
        context.sendError(request, LLAMACPP, 502, "no_owner", "nobody")
        self.assertEqual(request.code, 502)
        self.assertEqual(context.errors, [(502, "no_owner")])
        context.reportInternal("KeyError")
        self.assertEqual(context.internal, ["KeyError"])


class RequestContextTests(SynchronousTestCase):
    """What the process's context does with the reports of requests."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.sink = ListSink()
        self.metrics = Metrics()
        self.context = RequestContext(
            makeSettings(),
            self.clock,
            UpstreamSpy(self.clock),
            SinkSwitch(self.sink),
            self.metrics,
            LogControl("debug"),
        )
        self.exchange = ExchangeReport(self.context, LLAMACPP)

    def sample(self, name: str, **labels: str) -> float | None:
        value: float | None = self.metrics.registry.get_sample_value(name, labels)
        return value

    def test_interface(self) -> None:
        """It provides ``IRequestContext``; its sink switch is a broker sink; the exchange
        report record provides ``IExchangeReport``."""
        self.assertTrue(verifyObject(IRequestContext, self.context))
        self.assertTrue(verifyObject(IExchangeReport, self.exchange))
        self.assertTrue(verifyObject(IBrokerSink, self.context.sink))

    def test_sendErrorCounts(self) -> None:
        """A generated error is answered in the engine's shape and counted by reason."""
        request = FakeRequest()
        self.context.sendError(request, LLAMACPP, 503, "no_capacity", "busy", 7)
        self.assertEqual(request.code, 503)
        self.assertEqual(request.header(b"retry-after"), [b"7"])
        self.assertEqual(json.loads(request.body)["error"]["code"], "no_capacity")
        self.assertEqual(
            self.sample("nvpair_proxy_errors_total", engine="llamacpp", reason="no_capacity"), 1.0
        )

    def test_reportInternal(self) -> None:
        """An internal error is counted and reported to the broker by type name only."""
        self.context.reportInternal("ZeroDivisionError")
        self.assertEqual(
            self.sink.sent,
            [("errors:report", {"kind": "internal", "message": "unexpected ZeroDivisionError"})],
        )
        self.assertEqual(self.sample("nvpair_proxy_internal_errors_total"), 1.0)

    def test_attemptsReachTheHistory(self) -> None:
        """Failed and committed attempts are counted and kept per node in the history."""
        node = Node("A", False, ("http://a",), frozenset())
        outcome = Failed(FailureKind.TRANSPORT, node)
        self.context.attemptFailed(self.exchange, outcome)
        self.clock.advance(2)
        self.context.committed(self.exchange, "A")
        self.context.requestEnded(
            ExchangeReport(self.context, LLAMACPP, committedStatus=200, answered=True)
        )
        self.assertEqual(
            self.sample(
                "nvpair_proxy_dispatch_attempts_total", engine="llamacpp", reason="transport"
            ),
            1.0,
        )
        self.assertEqual(
            self.sample(
                "nvpair_proxy_dispatch_attempts_total", engine="llamacpp", reason="committed"
            ),
            1.0,
        )
        self.assertIn(("llamacpp", "A"), self.context.history.attempts)

    def test_forwardHeaders(self) -> None:
        """Upstream headers drop the hop-by-hop ones and Host."""
        incoming = Headers({b"host": [b"x"], b"connection": [b"close"], b"x-a": [b"1"]})
        out = self.context.forwardHeaders(incoming)
        self.assertEqual(list(out.getAllRawHeaders()), [(b"X-A", [b"1"])])


class SeamProviderTests(SynchronousTestCase):
    """The classes behind the request context's typed attributes provide their interfaces."""

    def test_providers(self) -> None:
        """Activity, workloads, stall watches and a failed attempt's report."""
        clock = Clock()
        sink = ListSink()
        reporter = WorkloadReporter(sink, clock)
        self.assertTrue(verifyObject(IWorkloadReporter, reporter))
        self.assertTrue(verifyObject(IWorkload, reporter.admit("llamacpp", "m")))
        self.assertTrue(verifyObject(IActivity, Activity(sink)))
        watches = StallWatches(clock, 10.0)
        self.assertTrue(verifyObject(IStallWatches, watches))
        context = RequestContext(
            makeSettings(), clock, UpstreamSpy(clock), SinkSwitch(sink), Metrics(), LogControl()
        )
        watch = watches.watch(StringTransport(), ExchangeReport(context, LLAMACPP), "A")
        self.assertTrue(verifyObject(IStallWatch, watch))
        node = Node("A", False, ("http://a",), frozenset())
        self.assertTrue(verifyObject(IAttemptReport, Failed(FailureKind.STATUS, node, 503)))
        self.assertTrue(verifyObject(ILogControl, LogControl()))
