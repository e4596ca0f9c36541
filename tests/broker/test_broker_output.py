"""What the broker channel writes: nothing after the stream ends, through a
``SinkSwitch``, a bounded backlog of notifications when the broker stops reading, and one
write per reactor turn given the reactor's turn ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker.channel import (
    BrokerChannel,
    ChannelState,
    NullSink,
    OutputFlow,
    SinkSwitch,
)
from nvpair.proxy.interfaces import IBrokerSink
from nvpair.proxy.runtime.eventloop import ITurnEnd
from nvpair.proxy.testing.wire import drainLines, sendLine
from tests.broker.channelkit import ChannelCase, FakeHandler


class ChannelTests(ChannelCase):
    """The end of the stream and the sink switch."""

    def test_notifyAfterClose(self) -> None:
        """Stdin EOF calls ``onClosed`` once; after connection loss nothing more is written."""
        self.assertIs(self.channel.state, ChannelState.OPEN)
        self.channel.readConnectionLost()
        self.channel.readConnectionLost()
        self.assertEqual(self.closed, 1)
        self.assertIs(self.channel.state, ChannelState.ENDED)
        self.channel.connectionLost(None)
        self.assertIs(self.channel.state, ChannelState.CLOSED)
        self.assertEqual(self.closed, 1)
        self.channel.notify("ollama:ready", {})
        self.assertEqual(self.transport.value(), b"")

    def test_lostWithoutEOF(self) -> None:
        """A connection lost without an EOF first still tells the process, once."""
        self.channel.connectionLost(None)
        self.channel.writeConnectionLost()
        self.assertEqual(self.closed, 1)
        self.assertIs(self.channel.state, ChannelState.CLOSED)

    def test_sinkSwitch(self) -> None:
        """The switch forwards to its current target and says whether anyone listens."""
        switch = SinkSwitch(NullSink())
        self.assertTrue(verifyObject(IBrokerSink, switch))
        self.assertFalse(switch.listening)
        switch.notify("ollama:ready", {})
        switch.target = self.channel
        self.assertTrue(switch.listening)
        switch.notify("ollama:ready", {"port": 1})
        self.assertEqual(self.output()[0]["params"], {"port": 1})


class BacklogTests(SynchronousTestCase):
    """A broker that stops reading stdout: notifications bounded, dropped ones reported."""

    def setUp(self) -> None:
        self.channel = BrokerChannel(FakeHandler(), lambda: None, backlogLimit=1000)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def lines(self) -> list[dict[str, Any]]:
        return drainLines(self.transport)[1]

    def stdout(self) -> Any:
        """The producer the channel registered (what the stdout transport pauses)."""
        return self.transport.producer

    def test_registeredAsStreamingProducer(self) -> None:
        """The channel learns from stdout's own buffer when the broker stops reading."""
        self.assertIsNotNone(self.transport.producer)
        self.assertTrue(self.transport.streaming)

    def test_flowingNothingDropped(self) -> None:
        """While the broker reads, every notification is written, however many."""
        for i in range(200):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.assertEqual(len(self.lines()), 200)

    def test_stalledBoundedThenReported(self) -> None:
        """Once stdout stalls, notifications fill the backlog allowance and the rest are
        dropped; when the broker has read everything, one overflow report says how many."""
        self.assertIs(self.channel.flow, OutputFlow.FLOWING)
        self.stdout().pauseProducing()
        self.assertIs(self.channel.flow, OutputFlow.STALLED)
        for i in range(100):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        raw, written = drainLines(self.transport)
        self.assertLessEqual(len(raw), 1000)
        kept = len(written)
        self.assertGreater(kept, 0)
        self.assertEqual([m["params"]["inFlight"] for m in written], list(range(kept)))
        self.stdout().resumeProducing()
        out = self.lines()
        self.assertEqual(
            out,
            [
                {
                    "jsonrpc": "2.0",
                    "method": "errors:report",
                    "params": {
                        "kind": "overflow",
                        "message": f"{100 - kept} notifications dropped while stdout was not read",
                    },
                }
            ],
        )
        self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": 0})
        self.assertEqual(len(self.lines()), 1, "flowing again")
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_responsesNeverDropped(self) -> None:
        """Answers to broker requests are written even past the backlog allowance."""
        self.stdout().pauseProducing()
        for i in range(100):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.lines()
        sendLine(self.channel, {"jsonrpc": "2.0", "id": 7, "method": "ping"})
        self.assertEqual(self.lines(), [{"jsonrpc": "2.0", "id": 7, "result": {"ok": True}}])

    def test_resumeWithoutDropsReportsNothing(self) -> None:
        """A short stall that stayed within the allowance leaves no report."""
        self.stdout().pauseProducing()
        self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": 1})
        self.stdout().resumeProducing()
        self.assertEqual([m["method"] for m in self.lines()], ["discovery:node-activity"])


@implementer(ITurnEnd)
class Turns:
    """A reactor's turn ends, run by the test."""

    def __init__(self) -> None:
        self.asked: list[Callable[[], object]] = []

    def callAtTurnEnd(self, f: Callable[[], object]) -> None:
        self.asked.append(f)

    def end(self) -> None:
        asked, self.asked = self.asked, []
        for f in asked:
            f()


class CountingTransport(StringTransport):
    """A ``StringTransport`` that counts writes."""

    writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class TurnTests(SynchronousTestCase):
    """Given the reactor's turn ends, a turn's lines go to stdout in one write, in order."""

    def setUp(self) -> None:
        self.turns = Turns()
        self.handler = FakeHandler()
        self.channel = BrokerChannel(self.handler, lambda: None, turnEnd=self.turns)
        self.transport = CountingTransport()
        self.channel.makeConnection(self.transport)

    def test_oneWritePerTurnInOrder(self) -> None:
        """Notifications and an answer of one turn: nothing written before the turn ends,
        then one write with every line in the order they came; the end is asked for once."""
        self.channel.notify("workload:submitted", {"n": 1})
        sendLine(self.channel, {"jsonrpc": "2.0", "id": 3, "method": "ping"})
        self.channel.notify("workload:started", {"n": 2})
        self.assertEqual(self.transport.value(), b"")
        self.assertEqual(len(self.turns.asked), 1)
        self.turns.end()
        self.assertEqual(self.transport.writes, 1)
        self.assertEqual(
            drainLines(self.transport)[1],
            [
                {"jsonrpc": "2.0", "method": "workload:submitted", "params": {"n": 1}},
                {"jsonrpc": "2.0", "id": 3, "result": {"ok": True}},
                {"jsonrpc": "2.0", "method": "workload:started", "params": {"n": 2}},
            ],
        )
        self.channel.notify("workload:completed", {"n": 3})
        self.assertEqual(len(self.turns.asked), 1, "the next turn asks again")
        self.turns.end()
        self.assertEqual(self.transport.writes, 2)
        self.assertEqual(len(drainLines(self.transport)[1]), 1)

    def test_lostBeforeTheTurnEnds(self) -> None:
        """Lines of a turn whose stdout is lost before it ends are not written."""
        self.channel.notify("workload:submitted", {"n": 1})
        self.channel.connectionLost(None)
        self.turns.end()
        self.assertEqual(self.transport.writes, 0)
        self.channel.notify("workload:started", {"n": 2})
        self.assertEqual(self.turns.asked, [])

    def test_stalledStillBounded(self) -> None:
        """A broker not reading stdout: the backlog allowance counts lines as they come,
        whether or not their turn has ended."""
        channel = BrokerChannel(FakeHandler(), lambda: None, backlogLimit=1000, turnEnd=self.turns)
        transport = StringTransport()
        channel.makeConnection(transport)
        stdout: Any = transport.producer  # what the stdout transport pauses
        stdout.pauseProducing()
        for i in range(100):
            channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.turns.end()
        raw, written = drainLines(transport)
        self.assertLessEqual(len(raw), 1000)
        self.assertEqual([m["params"]["inFlight"] for m in written], list(range(len(written))))
