"""Ending an exchange early (spec §5.3, §5.4): the client leaving before or after commit,
the dead-client deadline, shutdown, a node dying mid-copy, an internal error."""

from __future__ import annotations

from tests.support.exchangecase import SSE, USAGE, LoopCase


class CancellationTests(LoopCase):
    """Client disconnect, the dead-client deadline, shutdown, mid-copy failure (§5.3, §5.4)."""

    settings = {"clientWriteTimeout": 5.0}

    def test_clientGoneBeforeCommit(self) -> None:
        """The client leaves while A is pending: A is cancelled, nothing more is tried."""
        ex, request = self.start()
        call = self.upstream.last().connect()
        request.lose()
        self.assertTrue(call.cancelled)
        self.clock.advance(1000)
        self.assertEqual(len(self.upstream.calls), 1)
        info = self.terminal()
        self.assertEqual(info["state"], "cancelled")
        self.assertReleased()

    def test_clientGoneDuringBackoff(self) -> None:
        """The client leaves between rounds: no further attempt, cancelled."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.totalReserved(), 0, "released before backoff")
        request.lose()
        self.clock.advance(1000)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertReleased()

    def test_clientGoneAfterHeadersStopsUpstream(self) -> None:
        """Headers in, client leaves: the upstream body is stopped (engine sees a close)."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertReleased()

    def test_clientGoneMidStream(self) -> None:
        """After commit the client leaves: upstream stopped, workload cancelled, once."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.clock.advance(0)
        self.assertEqual(self.shape()[-1], ("workload:errored", "cancelled", "A"))
        self.assertNotIn("stats", self.terminal())
        self.assertReleased()

    def test_clientGoneAfterWholeStream(self) -> None:
        """The client hangs up after ``data: [DONE]`` but before the engine ends the body: the
        answer was delivered whole, so the workload is completed, with its statistics."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE + USAGE)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.clock.advance(0)
        self.assertEqual(self.shape()[-1], ("workload:completed", "completed", "A"))
        self.assertEqual(self.terminal()["stats"]["completionTokens"], 2)
        self.assertReleased()

    def test_clientGoneAfterWholeLengthBody(self) -> None:
        """A non-streamed answer whose Content-Length was all passed on is completed even if
        the client closes before the upstream signals the end."""
        ex, request = self.start()
        body = b'{"choices":[{"message":{"content":"hi"}}]}'
        response = self.upstream.last().respond(200, length=len(body))
        response.send(body)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "completed")

    def test_clientGoneShortOfLength(self) -> None:
        """A client that leaves before the whole Content-Length arrived is cancelled."""
        ex, request = self.start()
        response = self.upstream.last().respond(200, length=100)
        response.send(b"x" * 99)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "cancelled")

    def test_backpressureAndDeadClient(self) -> None:
        """A paused client pauses the upstream; past the write deadline it is cut: cancelled."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(b"x")
        request.pause()
        self.assertTrue(response.transport.paused)
        self.clock.advance(4)
        request.resume()
        self.assertFalse(response.transport.paused)
        request.pause()
        self.clock.advance(4.9)
        self.assertFalse(request.aborted)
        self.clock.advance(0.1)
        self.assertTrue(request.aborted)
        self.assertTrue(response.transport.stopped)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertReleased()

    def test_midCopyFailureTruncates(self) -> None:
        """The node dies after commit: relayed bytes flushed, connection closed; completed."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        response.fail()
        self.assertTrue(request.closed)
        self.assertFalse(request.aborted)
        self.assertFalse(request.finished)
        self.assertEqual(request.body, SSE)
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertEqual(len(self.upstream.calls), 1, "never retried after commit")
        self.assertReleased()

    def test_shutdownCancelsInFlight(self) -> None:
        """Shutdown cancels a pending attempt and a streaming one; both end cancelled."""
        ex1, r1 = self.start()
        ex2, r2 = self.start()
        pending = self.upstream.calls[0]
        streaming = self.upstream.calls[1].respond(200)
        streaming.send(b"x")
        for ex in list(self.context.exchanges):
            ex.shutdown()
        self.clock.advance(0)
        self.assertTrue(pending.cancelled)
        self.assertTrue(streaming.transport.stopped)
        ends = [i["state"] for m, i in self.events() if m == "workload:errored"]
        self.assertEqual(ends, ["cancelled", "cancelled"])
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.assertEqual(self.context.activity.inFlight, {})

    def test_internalErrorReleases(self) -> None:
        """An unexpected exception: 500 internal, workload failed, everything released."""
        ex, request = self.start()

        def boom(*a: object) -> None:
            raise ZeroDivisionError()

        self.patch(type(ex), "writeHead", boom)
        response = self.upstream.last().respond(200)
        response.send(b"x")
        self.clock.advance(0)
        self.assertEqual(request.code, 500)
        self.assertEqual(self.context.record.internal, ["ZeroDivisionError"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertTrue(response.transport.stopped)
        self.assertReleased()
