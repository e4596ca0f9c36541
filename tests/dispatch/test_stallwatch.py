"""The stream idle watch (``--stream-idle-timeout``) on a Clock, through a real ``Exchange``."""

from __future__ import annotations

from typing import Any

from twisted.internet.base import DelayedCall
from twisted.logger import ILogObserver, LogEvent, Logger
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.dispatch.stallwatch import StallWatch
from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.testing.upstreamspy import FakeResponse
from tests.support.cases.optionparse import assertExitsNaming, parse
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, startExchange

SSE = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'


@implementer(ILogObserver)
class LogEvents(list[LogEvent]):
    """A log observer keeping every event."""

    def __call__(self, event: LogEvent) -> None:
        self.append(event)


class StallCase(SynchronousTestCase):
    """A context on a Clock with a 10 s idle timeout, one owner, and the watch's log kept."""

    idleTimeout = 10.0

    def setUp(self) -> None:
        self.context = FakeContext(streamIdleTimeout=self.idleTimeout)
        self.clock = self.context.clock
        self.facade = makeFacade(self.clock, [node("A")])
        self.logged = LogEvents()
        self.patch(StallWatch, "log", Logger(observer=self.logged))

    def commit(self, request: FakeRequest | None = None) -> tuple[Any, FakeRequest, FakeResponse]:
        """Start a streamed chat and commit it with one chunk."""
        ex, request = startExchange(self.context, self.facade, request)
        response = self.context.upstream.last().respond(200)
        response.send(SSE)
        return ex, request, response

    def elapse(self, seconds: float, step: float = 0.05) -> None:
        """Let ``seconds`` pass in small steps, as a real reactor fires its timers on time
        (one big ``Clock.advance`` runs every due call at the final time)."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() + step < end:
            self.clock.advance(step)
        self.clock.advance(max(end - self.clock.seconds(), 0.0))

    def ticks(self) -> list[Any]:
        """The pending calls of the watches' timer."""
        return [
            c
            for c in self.clock.getDelayedCalls()
            if isinstance(c, DelayedCall) and getattr(c.func, "__name__", "") == "_tick"
        ]

    def terminals(self) -> list[dict[str, Any]]:
        return [
            info
            for method, info in self.context.sink.workloadEvents()
            if method in ("workload:completed", "workload:errored")
        ]

    def stalls(self) -> list[dict[str, Any]]:
        return [e for e in self.logged if e.get("log_format") == "stream-stalled"]


class CutTests(StallCase):
    """A committed stream whose engine is silent for the timeout is cut, once."""

    def test_cutAfterTimeout(self) -> None:
        """Silent for the timeout: engine connection stopped, client truncated, warning
        logged with workload, node and seconds idle, counted; never sooner than the timeout,
        never later than a quarter more; nothing retried; one workload ending."""
        ex, request, response = self.commit()
        self.elapse(9.99)
        self.assertFalse(response.transport.stopped)
        self.elapse(2.6)  # 12.59 s: past 1.25 x the timeout
        self.assertTrue(response.transport.stopped)
        self.clock.advance(0)  # the upstream connection's loss arrives
        self.assertTrue(request.closed, "the client's connection is closed")
        self.assertFalse(request.finished, "no clean end of the body")
        self.assertEqual(request.body, SSE)
        self.assertEqual(len(self.context.upstream.calls), 1, "never retried")
        self.assertEqual(len(self.terminals()), 1)
        self.assertEqual(self.terminals()[0]["state"], "completed")
        [event] = self.stalls()
        self.assertEqual(event["node"], "A")
        self.assertEqual(event["engine"], "llamacpp")
        self.assertEqual(event["workload"], ex.workload.id)
        self.assertGreaterEqual(event["idle"], 10.0)
        self.assertLessEqual(event["idle"], 12.5)
        self.assertEqual(event["log_level"].name, "warn")
        self.assertNotIn(SSE.decode(), repr(event))
        self.assertEqual(self.context.record.stalled, ["llamacpp"])
        self.clock.advance(1000)
        self.assertEqual(len(self.terminals()), 1, "exactly one workload ending")
        self.assertEqual(len(self.stalls()), 1)
        self.assertEqual(self.context.reservations.totalReserved(), 0)

    def test_cutWithinBounds(self) -> None:
        """Whatever the phase of the last byte, the cut is between 1 and 1.25 timeouts later."""
        for offset in (0.0, 1.3, 2.5, 3.7):
            self.setUp()
            ex, request, response = self.commit()
            self.elapse(offset)
            response.send(SSE)
            lastByte = self.clock.seconds()
            while not response.transport.stopped:
                self.clock.advance(0.05)
            waited = self.clock.seconds() - lastByte
            self.assertGreaterEqual(waited, self.idleTimeout - 1e-9, offset)
            self.assertLessEqual(waited, self.idleTimeout * 1.25 + 0.05 + 1e-9, offset)

    def test_chunksKeepItAlive(self) -> None:
        """A slow stream (gaps just under the timeout) is never cut and ends whole."""
        ex, request, response = self.commit()
        for _ in range(30):
            self.elapse(self.idleTimeout - 0.5)
            response.send(SSE)
        response.end()
        self.assertTrue(request.finished)
        self.assertEqual(request.body, SSE * 31)
        self.assertFalse(response.transport.stopped)
        self.assertEqual(self.stalls(), [])
        self.assertEqual(self.context.record.stalled, [])
        self.assertEqual(len(self.context.stalls), 0, "no longer watched")
        self.elapse(self.idleTimeout / 8)
        self.assertEqual(self.clock.getDelayedCalls(), [], "the timer stops once idle")

    def test_oneTimerForAllStreams(self) -> None:
        """Fifty streams are watched by one timer; each is cut on its own schedule."""
        streams = [self.commit() for _ in range(50)]
        self.assertEqual(len(self.ticks()), 1)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(len(self.context.stalls), 50)
        for _ in range(8):
            self.elapse(self.idleTimeout / 2)
            for _, _, response in streams[:25]:
                response.send(SSE)
        self.assertEqual([r.transport.stopped for _, _, r in streams], [False] * 25 + [True] * 25)
        self.assertEqual(len(self.ticks()), 1)
        for _, _, response in streams[:25]:
            response.end()
        self.elapse(self.idleTimeout)
        self.assertEqual(self.ticks(), [])
        self.assertEqual(len(self.stalls()), 25)
        self.assertEqual(len(self.terminals()), 50)

    def test_zeroDisables(self) -> None:
        """``0`` turns the watch off: a stream silent for hours is kept."""
        self.context = FakeContext(streamIdleTimeout=0.0)
        self.clock = self.context.clock
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request, response = self.commit()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(10 * 3600)
        self.assertFalse(response.transport.stopped)
        response.send(SSE)
        response.end()
        self.assertTrue(request.finished)
        self.assertEqual(self.stalls(), [])


class BackpressureTests(StallCase):
    """Time the proxy holds the engine back for a slow client is not engine silence."""

    def test_pausedNotCut(self) -> None:
        """While the client is paused the idle clock does not run; after resuming, the
        engine gets the whole timeout again."""
        self.context = FakeContext(streamIdleTimeout=self.idleTimeout, clientWriteTimeout=0.0)
        self.clock = self.context.clock
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request, response = self.commit()
        self.elapse(5)
        request.pause()
        self.assertTrue(response.transport.paused)
        self.elapse(100)
        self.assertFalse(response.transport.stopped)
        request.resume()
        self.elapse(self.idleTimeout - 0.1)
        self.assertFalse(response.transport.stopped)
        self.elapse(3)
        self.assertTrue(response.transport.stopped)
        self.assertEqual(len(self.stalls()), 1)

    def test_clientGoneStopsWatch(self) -> None:
        """The client leaving ends the stream as cancelled; the watch never fires after."""
        ex, request, response = self.commit()
        request.lose()
        self.clock.advance(0)
        self.clock.advance(1000)
        self.assertEqual([t["state"] for t in self.terminals()], ["cancelled"])
        self.assertEqual(self.stalls(), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class OptionTests(SynchronousTestCase):
    """``--stream-idle-timeout DUR`` (env ``NVPAIR_PROXY_STREAM_IDLE_TIMEOUT``), default 5m."""

    def test_values(self) -> None:
        """Default five minutes; durations as every other option; 0 allowed; flag wins."""
        self.assertEqual(parse([]).streamIdleTimeout, 300.0)
        self.assertEqual(parse(["--stream-idle-timeout", "90s"]).streamIdleTimeout, 90.0)
        self.assertEqual(parse(["--stream-idle-timeout", "0"]).streamIdleTimeout, 0.0)
        env = {"NVPAIR_PROXY_STREAM_IDLE_TIMEOUT": "2m"}
        self.assertEqual(parse([], env).streamIdleTimeout, 120.0)
        self.assertEqual(parse(["--stream-idle-timeout=1.5"], env).streamIdleTimeout, 1.5)

    def test_malformed(self) -> None:
        """A malformed value exits 2 with one stderr line naming the option."""
        assertExitsNaming(
            self,
            "--stream-idle-timeout",
            (
                (["--stream-idle-timeout", "soon"], {}),
                ([], {"NVPAIR_PROXY_STREAM_IDLE_TIMEOUT": "-1s"}),
            ),
        )
