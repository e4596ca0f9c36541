"""What the broker channel writes: nothing after the stream ends, through a
``SinkSwitch``, a bounded backlog of notifications when the broker stops reading, and one
write per reactor turn given the reactor's turn ends, straight to stdout's descriptor while
the transport holds nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.stdio import StandardIO
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker.channel import (
    BrokerChannel,
    ChannelState,
    NullSink,
    OutputFlow,
    SinkSwitch,
    writeSome,
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


class Descriptor:
    """What a non-blocking stdout takes: everything, or at most ``room`` bytes more."""

    def __init__(self, room: int | None = None) -> None:
        self.room = room
        self.taken = b""
        self.calls = 0

    def __call__(self, data: bytes) -> int:
        self.calls += 1
        n = len(data) if self.room is None else min(self.room, len(data))
        if self.room is not None:
            self.room -= n
        self.taken += data[:n]
        return n


class DirectTests(SynchronousTestCase):
    """Given stdout's descriptor, a turn's lines go straight to it while the transport holds
    nothing; what it does not take goes through the transport until that has drained."""

    def setUp(self) -> None:
        self.turns = Turns()
        self.out = Descriptor()
        self.channel = BrokerChannel(
            FakeHandler(), lambda: None, backlogLimit=1000, turnEnd=self.turns, output=self.out
        )
        self.transport = CountingTransport()
        self.channel.makeConnection(self.transport)

    def test_straightToTheDescriptor(self) -> None:
        """A turn's lines: one call on the descriptor, in order, nothing through the
        transport; the channel is told when the transport drains (a pull producer)."""
        self.assertIsNotNone(self.transport.producer)
        self.assertFalse(self.transport.streaming)
        self.channel.notify("workload:submitted", {"n": 1})
        sendLine(self.channel, {"jsonrpc": "2.0", "id": 3, "method": "ping"})
        self.turns.end()
        self.assertEqual((self.out.calls, self.transport.writes), (1, 0))
        self.assertEqual(
            [json.loads(line) for line in self.out.taken.splitlines()],
            [
                {"jsonrpc": "2.0", "method": "workload:submitted", "params": {"n": 1}},
                {"jsonrpc": "2.0", "id": 3, "result": {"ok": True}},
            ],
        )

    def test_shortWriteThenThroughTheTransport(self) -> None:
        """The descriptor takes part of a turn: the rest goes to the transport, in order, and
        later turns go there too, within the backlog allowance, until the transport says it
        has written everything; then one overflow report, and straight to the descriptor."""
        self.out.room = 10
        self.channel.notify("workload:submitted", {"n": 1})
        self.turns.end()
        self.assertIs(self.channel.flow, OutputFlow.STALLED)
        for i in range(100):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.turns.end()
        self.assertEqual(self.out.calls, 1, "nothing straight to the descriptor while stalled")
        stream = self.out.taken + self.transport.value()
        lines = [json.loads(line) for line in stream.splitlines()]
        self.assertEqual(lines[0]["params"], {"n": 1})
        kept = [m["params"]["inFlight"] for m in lines[1:]]
        self.assertEqual(kept, list(range(len(kept))))
        self.assertLess(len(kept), 100)
        self.assertLessEqual(len(stream.split(b"\n", 1)[1]), 1000, "the backlog allowance")
        self.transport.clear()
        self.out.room = None
        before = len(self.out.taken)
        drained: Any = self.transport.producer
        drained.resumeProducing()
        self.turns.end()
        self.assertIs(self.channel.flow, OutputFlow.FLOWING)
        self.assertEqual(self.transport.value(), b"")
        report = json.loads(self.out.taken[before:])
        self.assertEqual(report["method"], "errors:report")
        self.assertEqual(
            report["params"]["message"],
            f"{100 - len(kept)} notifications dropped while stdout was not read",
        )


class PipeTests(SynchronousTestCase):
    """``writeSome`` and Twisted's stdio on a real pipe (a ``MemoryReactor``: nothing runs
    but what the test calls)."""

    def setUp(self) -> None:
        self.inRead, self.inWrite = os.pipe()
        self.outRead, self.outWrite = os.pipe()
        for fd in (self.inRead, self.inWrite, self.outRead, self.outWrite):
            self.addCleanup(_close, fd)

    def test_writeSomeTakesWhatFits(self) -> None:
        """A full pipe takes part, then nothing; a pipe whose reader closed takes nothing."""
        os.set_blocking(self.outWrite, False)
        data = b"x" * (1 << 20)
        first = writeSome(self.outWrite, data)
        self.assertGreater(first, 0)
        self.assertLess(first, len(data))
        self.assertEqual(writeSome(self.outWrite, data), 0)
        os.close(self.outRead)
        self.assertEqual(writeSome(self.outWrite, b"y"), 0)

    def test_stallAndDrainThroughStandardIO(self) -> None:
        """Under Twisted's own stdio transport: a turn larger than the pipe stalls the
        output, the rest waits in the transport, and once the reactor has written it all
        the channel writes straight to the pipe again; the reader sees every byte, in order."""
        reactor = MemoryReactor()
        turns = Turns()
        channel = BrokerChannel(
            FakeHandler(), lambda: None, turnEnd=turns, output=partial(writeSome, self.outWrite)
        )
        stdio: Callable[..., object] = StandardIO  # the POSIX one's signature: not win32's
        stdio(channel, stdin=self.inRead, stdout=self.outWrite, reactor=reactor)
        big = "z" * 100_000
        channel.notify("discovery:node-activity", {"nodeId": big})
        turns.end()
        self.assertIs(channel.flow, OutputFlow.STALLED)
        (writer,) = (w for w in reactor.getWriters() if w.fileno() == self.outWrite)
        received = b""
        for _ in range(100):
            received += os.read(self.outRead, 1 << 16)
            if writer.doWrite() is None and writer not in reactor.getWriters():
                break
        self.assertIs(channel.flow, OutputFlow.FLOWING)
        channel.notify("workload:started", {"n": 2})
        turns.end()
        self.assertEqual(reactor.getWriters(), [], "straight to the pipe")
        received += os.read(self.outRead, 1 << 17)
        lines = [json.loads(line) for line in received.splitlines()]
        self.assertEqual(
            [m["method"] for m in lines], ["discovery:node-activity", "workload:started"]
        )
        self.assertEqual(lines[0]["params"]["nodeId"], big)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
