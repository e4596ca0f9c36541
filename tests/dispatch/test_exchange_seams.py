"""The seams of an exchange: the fakes the exchange tests use provide the interfaces of what
they replace, the real parts provide the interfaces their callers type them with, and the
fake request tells of a lost client exactly as ``http.request.ServerRequest`` does."""

from __future__ import annotations

from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IResponse
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.dispatch.attempt import Attempt
from nvpair.proxy.dispatch.interfaces import (
    IAttemptExchange,
    IBodyGate,
    IDiscoveryWatcher,
    IFacadeView,
)
from nvpair.proxy.dispatch.outcome import Committed, Failed, ICommittedBody
from nvpair.proxy.dispatch.relay import ClientFlow
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.http.interfaces import (
    IConnectionPool,
    IServerChannel,
    IServerRequest,
    IStreamTransport,
)
from nvpair.proxy.interfaces import IBrokerSink, IUpstream
from nvpair.proxy.placement.choose import Placed
from nvpair.proxy.placement.interfaces import IFleetView, IOutcome, IPlacementExchange
from nvpair.proxy.testing.fakecontext import ListSink
from nvpair.proxy.testing.upstreamspy import BodyTransport, FakeResponse, NoPool, UpstreamSpy
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import ClientTransport, FakeRequest
from tests.support.fakeupstream import makeFacade, node


@implementer(ICommittedBody)
class _Body:
    """A committed body that is never stopped."""

    def stopBody(self) -> None:
        raise AssertionError("not stopped in these tests")


class FakeTests(SynchronousTestCase):
    """Each fake provides the interface of what it stands for."""

    def test_fakes(self) -> None:
        clock = Clock()
        request = FakeRequest()
        response = FakeResponse(clock, 200)
        self.assertTrue(verifyObject(IServerRequest, request))
        assert request.channel is not None
        self.assertTrue(verifyObject(IServerChannel, request.channel))
        self.assertTrue(verifyObject(IStreamTransport, ClientTransport(request)))
        self.assertTrue(verifyObject(IResponse, response))
        self.assertTrue(verifyObject(IPushProducer, BodyTransport(response)))
        self.assertTrue(verifyObject(IUpstream, UpstreamSpy(clock)))
        self.assertTrue(verifyObject(IBrokerSink, ListSink()))
        self.assertTrue(verifyObject(IConnectionPool, NoPool()))

    def test_lostClientTold(self) -> None:
        """``whenLost`` hears of a client gone mid-answer, once, with the reason."""
        request = FakeRequest()
        reasons: list[Failure] = []
        request.whenLost(reasons.append)
        request.write(b"partial")
        request.lose()
        request.lose()
        self.assertEqual(len(reasons), 1)
        self.assertTrue(request.disconnected)

    def test_notToldAfterFinish(self) -> None:
        """A client that leaves after its answer ended is not reported lost."""
        request = FakeRequest()
        reasons: list[Failure] = []
        request.whenLost(reasons.append)
        request.finish()
        request.lose()
        self.assertEqual(reasons, [])


class ProviderTests(LoopCase):
    """The real parts provide what their callers type them with."""

    def test_exchangeAndAttempt(self) -> None:
        """A streaming exchange is both the policy's and the attempt's exchange; its attempt
        is the body's gate, the committed body and a discovery watcher."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(b"x")
        self.assertTrue(verifyObject(IPlacementExchange, ex))
        self.assertTrue(verifyObject(IAttemptExchange, ex))
        committed = ex.serving
        assert committed is not None
        self.assertTrue(verifyObject(IOutcome, committed))
        attempt = committed.attempt
        self.assertIsInstance(attempt, Attempt)
        for interface in (IBodyGate, ICommittedBody, IDiscoveryWatcher):
            self.assertTrue(verifyObject(interface, attempt))
        self.assertIsInstance(ex.flow, ClientFlow)
        self.assertTrue(verifyObject(IPushProducer, ex.flow))

    def test_outcomes(self) -> None:
        """Both endings of an attempt are outcomes a policy reads alike."""
        a = node("A")
        failed = Failed(FailureKind.LEFT, a)
        self.assertTrue(verifyObject(IOutcome, failed))
        self.assertEqual((failed.committed, failed.kind), (False, "left"))
        body = _Body()
        self.assertTrue(verifyObject(ICommittedBody, body))
        committed = Committed(a, 200, body)
        self.assertTrue(verifyObject(IOutcome, committed))
        self.assertEqual((committed.committed, committed.kind), (True, None))

    def test_facade(self) -> None:
        """A facade is the view of the fleet placement and attempts read."""
        facade = makeFacade(Clock(), [node("A")])
        self.assertTrue(verifyObject(IFleetView, facade))
        self.assertTrue(verifyObject(IFacadeView, facade))


class NamedStateTests(SynchronousTestCase):
    """Named states keep the names that leave the process."""

    def test_affinityResults(self) -> None:
        """Placements are counted under the names ``/status`` and ``/metrics`` show."""
        self.assertEqual([p.name.lower() for p in Placed], ["hit", "miss", "overridden"])

    def test_failureKinds(self) -> None:
        """Failure kinds are the strings metrics and history report."""
        self.assertEqual(
            sorted(FailureKind),
            ["header_timeout", "left", "moved", "no_content", "status", "transport"],
        )
