"""The kit's fakes of the proxy's seams (``upstreamspy``, ``fakecontext``): each provides the
interface it stands for, records what it is asked as typed, frozen records, and says how to
fix a misuse."""

from __future__ import annotations

import attrs
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface.verify import verifyObject

from nvpair.proxy.dispatch.outcome import Failed
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import LLAMACPP
from nvpair.proxy.http.interfaces import IConnectionPool
from nvpair.proxy.interfaces import IBrokerSink, IExchangeReport, IRequestContext, IUpstream
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.fakecontext import ExchangeReport, FakeContext, ListSink
from nvpair.proxy.testing.upstreamspy import (
    FakeResponse,
    NoPool,
    UpstreamCall,
    UpstreamSpy,
    upstreamSpy,
)

NODE = Node("A", False, ("http://a",), frozenset({"m1"}))


def ask(upstream: IUpstream, node: Node | None = NODE) -> defer.Deferred[IResponse]:
    return upstream.request(node, "http://a", b"POST", b"/v1/chat", Headers(), b"{}")


class UpstreamSpyTests(SynchronousTestCase):
    """``upstreamSpy`` returns an ``IUpstream`` and the list of its calls."""

    def test_providerAndCalls(self) -> None:
        """Each request appends one frozen record of its arguments and Deferred."""
        spy, calls = upstreamSpy(Clock())
        self.assertTrue(verifyObject(IUpstream, spy))
        self.assertEqual(calls, [])
        d = ask(spy)
        self.assertEqual(len(calls), 1)
        call = calls[0]
        self.assertIsInstance(call, UpstreamCall)
        self.assertEqual(
            (call.node, call.address, call.method, call.path, call.body),
            (NODE, "http://a", b"POST", b"/v1/chat", b"{}"),
        )
        self.assertIs(call.deferred, d)
        with self.assertRaises(attrs.exceptions.FrozenInstanceError):
            call.body = b"changed"  # type: ignore[misc]

    def test_answered(self) -> None:
        """``respond`` fires the request with an ``IResponse`` whose body is delivered by
        hand through an ``IPushProducer``; ``refuse`` fails it."""
        spy, calls = upstreamSpy(Clock())
        d = ask(spy)
        response = calls[0].respond(503)
        self.assertIs(self.successResultOf(d), response)
        self.assertIs(calls[0].response, response)
        self.assertTrue(verifyObject(IResponse, response))
        self.assertTrue(verifyObject(IPushProducer, response.transport))
        self.assertTrue(verifyObject(IConnectionPool, NoPool()))
        d = ask(spy)
        spy.last().refuse()
        self.failureResultOf(d, ConnectionRefusedError)

    def test_cancelled(self) -> None:
        """A request its caller cancels is marked so, and is no longer pending."""
        spy, calls = upstreamSpy(Clock())
        d = ask(spy)
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(calls[0].cancelled)
        self.assertEqual(spy.pending(), [])

    def test_misuseExplained(self) -> None:
        """Answering twice, asking for the last call of none, a node id of a call without a
        node, or ending a body nobody read: each error says what to do instead."""
        spy = UpstreamSpy(Clock())
        error = self.assertRaises(AssertionError, spy.last)
        self.assertIn("did the exchange start", str(error))
        d = ask(spy, node=None)
        spy.last().respond(200)
        error = self.assertRaises(AssertionError, spy.last().respond, 200)
        self.assertIn("answer each call once", str(error))
        error = self.assertRaises(AssertionError, lambda: spy.last().nodeId)
        self.assertIn("read .address", str(error))
        response = self.successResultOf(d)
        assert isinstance(response, FakeResponse)
        error = self.assertRaises(AssertionError, response.end)
        self.assertIn("deliverBody", str(error))


class FakeContextTests(SynchronousTestCase):
    """``FakeContext`` provides ``IRequestContext`` and records the reports made to it."""

    def test_interfaces(self) -> None:
        """The context, its sink and an exchange report provide their interfaces."""
        context = FakeContext()
        self.assertTrue(verifyObject(IRequestContext, context))
        self.assertIsInstance(context.upstream, UpstreamSpy)
        self.assertTrue(verifyObject(IBrokerSink, ListSink()))
        self.assertTrue(verifyObject(IExchangeReport, ExchangeReport(context, LLAMACPP)))

    def test_hooksRecorded(self) -> None:
        """Failed attempts, commits and ends are recorded as they were reported."""
        context = FakeContext()
        exchange = ExchangeReport(context, LLAMACPP, committedStatus=200, answered=True)
        failed = Failed(FailureKind.TRANSPORT, NODE)
        context.attemptFailed(exchange, failed)
        context.committed(exchange, "A")
        context.requestEnded(exchange)
        context.streamStalled("llamacpp")
        self.assertEqual(context.record.failedAttempts, [failed])
        self.assertEqual(context.record.commits, ["A"])
        self.assertEqual(context.record.ended, [exchange])
        self.assertEqual(context.record.stalled, ["llamacpp"])
