"""Unit tests of the bounds the facade's HTTP/1.1 server keeps: bodies over ``maxBody``,
heads, lines and trailers over ``maxHeaderBytes``, ``Expect: 100-continue``, and the
deadlines on slow heads and idle connections (none while answering). Parsing, framing and
pipelining are in ``test_httpserver_exchange``."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.http.httpkit import GET, Connection, Door, answer, chunkedPost, errorOf


def trickle(start: bytes, piece: bytes) -> bytes:
    """Send ``start``, then ``piece`` at most 200 times to a connection whose head limit is
    1,000 bytes, until it answers; what it answered (nothing if it never did)."""
    conn = Connection(Door(), maxHeaderBytes=1000)
    conn.send(start)
    sent = b""
    for _ in range(200):
        sent += conn.send(piece)
        if sent:
            break
    return sent


class LimitTests(SynchronousTestCase):
    """Bodies over ``maxBody``, heads over ``maxHeaderBytes``, and Expect."""

    def test_bodyTooLargeReadAndDropped(self) -> None:
        """A body over the limit is read to its end, not kept, and the request flagged."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        conn.send(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 20\r\n\r\n" + b"y" * 19)
        self.assertEqual(door.requests, [])
        conn.send(b"y")
        self.assertTrue(door.requests[0].tooLarge)
        self.assertEqual(door.bodies, [None])

    def test_chunkedBodyGrowsTooLarge(self) -> None:
        """A chunked body growing past the limit is flagged and dropped."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        conn.send(chunkedPost(b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"))
        self.assertTrue(door.requests[0].tooLarge)
        self.assertEqual(door.bodies, [None])

    def test_expectContinue(self) -> None:
        """``Expect: 100-continue`` within the limit gets ``100 Continue`` before the body."""
        door = Door(hold=True)
        conn = Connection(door)
        out = conn.send(
            b"POST /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        self.assertEqual(out, b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.send(b"ok")
        self.assertEqual(door.bodies, [b"ok"])

    def test_expectContinueAfterAnswerInProgress(self) -> None:
        """A pipelined request expecting 100 gets it only once the answer before it ends."""
        door = Door(hold=True)
        conn = Connection(door)
        out = conn.send(
            GET + b"POST /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
            b"Content-Length: 2\r\n\r\n"
        )
        self.assertEqual(out, b"")
        answer(door.requests[0], b"first")
        out = conn.take()
        self.assertTrue(out.endswith(b"first" + b"HTTP/1.1 100 Continue\r\n\r\n"), out)

    def test_noContinueAfterRefusal(self) -> None:
        """A request refused while it waited for its 100 never gets one after the error."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(GET + chunkedPost(b"zz\r\n", extra=b"Expect: 100-continue\r\n"))
        answer(door.requests[0], b"first")
        out = conn.take()
        self.assertNotIn(b"100 Continue", out)
        self.assertEqual(errorOf(out.partition(b"first")[2])[0], 400)

    def test_expectContinueTooLarge(self) -> None:
        """An announced body over the limit is answered at once, without 100, then closed."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        out = conn.send(
            b"POST /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 99\r\n\r\n"
        )
        self.assertEqual(out, b"")
        [request] = door.requests
        self.assertTrue(request.tooLarge)
        conn.send(b"x" * 99)  # sent anyway: dropped
        answer(request, b"no")
        self.assertIn(b"Connection: close\r\n", conn.take())
        self.assertTrue(conn.closed)
        self.assertEqual(len(door.requests), 1)

    def test_headTooLarge(self) -> None:
        """A head over the limit, complete or not, is 431 in the error shape, and closes."""
        for tail in (b"", b"\r\n\r\n"):
            conn = Connection(Door(), maxHeaderBytes=100)
            out = conn.send(b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"v" * 200 + tail)
            status, headers, doc = errorOf(out)
            self.assertEqual(status, 431)
            self.assertEqual(doc["error"]["code"], "bad_request")
            self.assertEqual(headers["connection"], b"close")
            self.assertTrue(conn.closed)

    def test_longLineTrickled(self) -> None:
        """A header line that never ends is 431 once it passes the limit, however it is
        sent (httptools would otherwise hold it all)."""
        sent = trickle(b"GET / HTTP/1.1\r\nHost: h\r\nX: ", b"v" * 10)
        self.assertTrue(sent.startswith(b"HTTP/1.1 431 "), sent)

    def test_longTargetTrickled(self) -> None:
        """A request target that never ends is 431 too."""
        sent = trickle(b"GET /", b"a" * 10)
        self.assertTrue(sent.startswith(b"HTTP/1.1 431 "), sent)

    def test_tooManyHeaders(self) -> None:
        """More than 500 header fields is 431."""
        conn = Connection(Door(), maxHeaderBytes=1 << 20)
        out = conn.send(b"GET / HTTP/1.1\r\nHost: h\r\n" + b"A: b\r\n" * 500 + b"\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 431 "), out)

    def test_trailersTooLarge(self) -> None:
        """Trailers of a chunked body count against the head limit too."""
        conn = Connection(Door(), maxHeaderBytes=200)
        out = conn.send(chunkedPost(b"1\r\na\r\n0\r\n" + b"T: " + b"t" * 300 + b"\r\n\r\n"))
        self.assertTrue(out.startswith(b"HTTP/1.1 431 "), out)

    def test_chunkLineWithoutEnd(self) -> None:
        """A chunk-size line (extensions) that never ends is 400."""
        conn = Connection(Door(), maxHeaderBytes=500)
        conn.send(chunkedPost(b"5;ext="))
        sent = b""
        for _ in range(200):
            sent += conn.send(b"e" * 10)
            if sent:
                break
        self.assertTrue(sent.startswith(b"HTTP/1.1 400 "), sent)


class DeadlineTests(SynchronousTestCase):
    """Slow heads and idle bodies are cut; answering has no deadline."""

    def test_slowHeadCut(self) -> None:
        """A head still incomplete after the timeout is aborted and counted."""
        conn = Connection(Door(), timeout=5.0)
        conn.send(b"GET / HTTP/1.1\r\n")
        conn.clock.advance(4.0)
        conn.send(b"X: y\r\n")  # trickling does not extend a head's deadline
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(1.5)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(conn.site.slowClients, 1)

    def test_idleBetweenRequestsCut(self) -> None:
        """A kept-alive connection idle for the timeout after an answer is cut."""
        conn = Connection(Door(), timeout=5.0)
        conn.clock.advance(4.0)
        conn.send(GET)
        conn.clock.advance(4.0)
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(1.5)
        self.assertTrue(conn.transport.disconnecting)

    def test_bodyIdleCut(self) -> None:
        """A body that keeps arriving lives on; one idle for the timeout is cut."""
        conn = Connection(Door(), timeout=5.0)
        conn.send(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n1")
        for _ in range(3):
            conn.clock.advance(4.0)
            conn.send(b"2")
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(5.5)
        self.assertTrue(conn.transport.disconnecting)

    def test_noDeadlineWhileAnswering(self) -> None:
        """A request being answered keeps its connection however long it takes, even with
        a partial request pipelined behind it."""
        door = Door(hold=True)
        conn = Connection(door, timeout=5.0)
        conn.send(GET + b"GET / HT")
        conn.clock.advance(3600.0)
        self.assertFalse(conn.transport.disconnecting)
        self.assertEqual(conn.site.slowClients, 0)
        answer(door.requests[0], b"x")
        conn.clock.advance(5.5)  # the next head's time starts when the answer ends
        self.assertTrue(conn.transport.disconnecting)
