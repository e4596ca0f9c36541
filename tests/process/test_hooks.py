"""Tests for nvpair.proxy.hooks: the request hooks' fan-out to observers."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.dispatch.outcome import Failed
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import LLAMACPP
from nvpair.proxy.hooks import ObservedContext, RequestObserver
from nvpair.proxy.interfaces import IAttemptReport, IExchangeReport, IRequestObserver
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.fakecontext import ExchangeReport, FakeContext


class _Commits(RequestObserver):
    """Hears commits only; raises on the first when told to."""

    def __init__(self, heard: list[str], name: str, raises: bool = False) -> None:
        self.heard = heard
        self.name = name
        self.raises = raises

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        self.heard.append(f"{self.name} committed {nodeId}")
        if self.raises:
            raise RuntimeError("observer bug")


@implementer(IRequestObserver)
class _Everything:
    """Provides the interface without subclassing ``RequestObserver``: hears every hook."""

    def __init__(self, heard: list[str]) -> None:
        self.heard = heard

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        self.heard.append("all attemptFailed")

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        self.heard.append(f"all committed {nodeId}")

    def requestEnded(self, exchange: IExchangeReport) -> None:
        self.heard.append("all requestEnded")

    def streamStalled(self, engineId: str) -> None:
        self.heard.append(f"all streamStalled {engineId}")


class FanOutTests(SynchronousTestCase):
    """Each hook reaches the observers that define it, in the order they were added, and a
    raising observer is counted without keeping the event from the others."""

    def setUp(self) -> None:
        self.failed: list[str] = []
        self.heard: list[str] = []
        self.context = ObservedContext(self.failed.append)
        self.exchange = ExchangeReport(FakeContext(), LLAMACPP)

    def test_order(self) -> None:
        """Observers hear in the order added; one that keeps ``RequestObserver``'s
        do-nothing hooks hears nothing of them, and the others still do."""
        self.context.observe(_Commits(self.heard, "first"))
        self.context.observe(RequestObserver())
        self.context.observe(_Everything(self.heard))
        self.context.observe(_Commits(self.heard, "last"))
        node = Node("A", False, ("http://a",), frozenset())
        self.context.attemptFailed(self.exchange, Failed(FailureKind.TRANSPORT, node))
        self.context.committed(self.exchange, "A")
        self.context.requestEnded(self.exchange)
        self.context.streamStalled("llamacpp")
        self.assertEqual(
            self.heard,
            [
                "all attemptFailed",
                "first committed A",
                "all committed A",
                "last committed A",
                "all requestEnded",
                "all streamStalled llamacpp",
            ],
        )
        self.assertEqual(len(self.context.observers), 4)

    def test_raising(self) -> None:
        """A raising observer is reported once per event through ``hookFailed``; the
        observers after it still hear the event."""
        self.context.observe(_Commits(self.heard, "bad", raises=True))
        self.context.observe(_Commits(self.heard, "good"))
        self.context.committed(self.exchange, "A")
        self.context.committed(self.exchange, "B")
        self.assertEqual(
            self.heard,
            ["bad committed A", "good committed A", "bad committed B", "good committed B"],
        )
        self.assertEqual(self.failed, ["committed", "committed"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
