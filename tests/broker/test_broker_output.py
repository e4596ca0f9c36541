"""What the broker channel writes: nothing after the stream ends, through a
``SinkSwitch``, and a bounded backlog of notifications when the broker stops reading."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.broker.channel import (
    BrokerChannel,
    ChannelState,
    NullSink,
    OutputFlow,
    SinkSwitch,
)
from nvpair.proxy.interfaces import IBrokerSink
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
