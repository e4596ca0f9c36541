"""Unit tests of the facade's own HTTP/1.1 server framing (``httpserver``, ``serverrequest``)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.httpserver import PIPELINE_HOLD
from nvpair.proxy.site import FacadeSite


class Door:
    """Records requests; answers each with ``body`` at once unless ``hold`` is set."""

    def __init__(self, body: bytes = b"ok", hold: bool = False, length: bool = True) -> None:
        self.body = body
        self.hold = hold
        self.length = length
        self.requests: list[Any] = []
        self.crashes: list[Exception] = []

    def handle(self, request: Any) -> None:
        self.requests.append(request)
        if not self.hold:
            answer(request, self.body, self.length)

    def crashed(self, request: Any, error: Exception) -> None:
        self.crashes.append(error)


def answer(request: Any, body: bytes, length: bool = True) -> None:
    """Answer ``request`` with 200 and ``body``."""
    request.setResponseCode(200)
    if length:
        request.setHeader(b"content-length", b"%d" % len(body))
    request.write(body)
    request.finish()


class Connection:
    """A facade channel over a ``StringTransport`` with a fake clock."""

    def __init__(self, door: Door, maxBody: int = 1000, timeout: float = 30.0,
                 maxHeaderBytes: int = 4096) -> None:
        self.clock = Clock()
        self.site = FacadeSite(door, self.clock, maxBody, timeout, maxHeaderBytes)
        self.channel = self.site.buildProtocol(None)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def send(self, data: bytes) -> bytes:
        self.channel.dataReceived(data)
        return self.take()

    def take(self) -> bytes:
        out = self.transport.value()
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


GET = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\r\n"


def answering() -> tuple[Connection, Any]:
    """A connection whose door holds the ``GET`` it received, unanswered."""
    door = Door(hold=True)
    conn = Connection(door)
    conn.send(GET)
    return conn, door.requests[0]


class RequestParsingTests(SynchronousTestCase):
    """A request head becomes the method, target, path and headers the door sees."""

    def test_requestSurface(self) -> None:
        """Method, uri, path, protocol and every header value (in order) reach the door."""
        door = Door()
        Connection(door).send(GET)
        [request] = door.requests
        self.assertEqual((request.method, request.uri, request.path, request.clientproto),
                         (b"GET", b"/v1/models?x=1", b"/v1/models", b"HTTP/1.1"))
        self.assertEqual(request.requestHeaders.getRawHeaders(b"x-a"), [b"1", b"2"])
        self.assertEqual(request.getHeader(b"X-A"), b"2")
        self.assertIsNone(request.getHeader(b"absent"))
        self.assertIsNone(request.content)

    def test_contentLengthBodyInPieces(self) -> None:
        """A body sent in pieces is handed over whole, once it has all arrived."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(b"POST /a HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123")
        self.assertEqual(door.requests, [])
        conn.send(b"456")
        conn.send(b"789")
        [request] = door.requests
        self.assertEqual(request.content.getvalue(), b"0123456789")
        self.assertFalse(request.tooLarge)

    @given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
    def test_chunkedBodyAnySplit(self, cuts: list[int]) -> None:
        """A chunked body with extensions and trailers decodes the same however it is split."""
        raw = (b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nX-Trailer: t\r\n\r\n")
        door = Door(hold=True)
        conn = Connection(door)
        at = 0
        for cut in cuts:
            conn.channel.dataReceived(raw[at:at + cut])
            at += cut
        conn.channel.dataReceived(raw[at:])
        [request] = door.requests
        self.assertEqual(request.content.getvalue(), b"hello, world!!!")

    def test_headByteByByte(self) -> None:
        """A head (and the next one) sent a byte at a time is found exactly once each."""
        door = Door(hold=True)
        conn = Connection(door)
        raw = b"\r\n" + GET
        for i in range(len(raw)):
            conn.channel.dataReceived(raw[i:i + 1])
        self.assertEqual(len(door.requests), 1)
        self.assertEqual(door.requests[0].getHeader(b"x-a"), b"2")

    def test_manySmallChunksInOneRead(self) -> None:
        """A thousand one-byte chunks in one read decode to the whole body."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=5000)
        body = bytes(range(256)) * 4
        chunks = b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body)))
        conn.send(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
                  + b"0\r\n\r\n" + GET)
        self.assertEqual(door.requests[0].content.getvalue(), body)
        answer(door.requests[0], b"x")
        self.assertEqual(door.requests[1].path, b"/v1/models")

    def test_strayLineEndsBeforeRequest(self) -> None:
        """Blank lines before a request line are ignored."""
        door = Door()
        Connection(door).send(b"\r\n\r\n" + GET)
        self.assertEqual(len(door.requests), 1)


class ResponseFramingTests(SynchronousTestCase):
    """Answers are framed by length, by chunks, or by the connection's end."""

    def test_lengthAnswerKeepsConnection(self) -> None:
        """An answer with a length leaves with its head in one write; the connection stays."""
        conn = Connection(Door(b"hello"))
        out = conn.send(GET)
        self.assertTrue(out.startswith(b"HTTP/1.1 200 OK\r\n"), out)
        self.assertTrue(out.endswith(b"\r\n\r\nhello"), out)
        self.assertIn(b"Content-Length: 5\r\n", out)
        self.assertFalse(conn.closed)

    def test_chunkedWithoutLength(self) -> None:
        """An HTTP/1.1 answer without a length is chunked and ends with the last chunk."""
        conn = Connection(Door(b"hello", length=False))
        out = conn.send(GET)
        self.assertIn(b"Transfer-Encoding: chunked\r\n", out)
        self.assertTrue(out.endswith(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), out)

    def test_http10EndsWithConnection(self) -> None:
        """An HTTP/1.0 answer without a length is not chunked and closes the connection."""
        conn = Connection(Door(b"hello", length=False))
        out = conn.send(b"GET / HTTP/1.0\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.0 200 OK\r\n"), out)
        self.assertNotIn(b"chunked", out)
        self.assertTrue(out.endswith(b"\r\n\r\nhello"))
        self.assertTrue(conn.closed)

    def test_headHasNoBody(self) -> None:
        """A HEAD answer keeps its Content-Length and sends no body."""
        conn = Connection(Door(b"hello"))
        out = conn.send(b"HEAD / HTTP/1.1\r\n\r\n")
        self.assertIn(b"Content-Length: 5\r\n", out)
        self.assertTrue(out.endswith(b"\r\n\r\n"), out)

    def test_noContentHasNoBody(self) -> None:
        """A 204 answer carries neither a body nor chunk framing."""
        conn, request = answering()
        request.setResponseCode(204)
        request.write(b"ignored")
        request.finish()
        out = conn.take()
        self.assertTrue(out.startswith(b"HTTP/1.1 204 No Content\r\n"), out)
        self.assertTrue(out.endswith(b"\r\n\r\n"), out)
        self.assertNotIn(b"chunked", out)

    def test_clientAsksClose(self) -> None:
        """``Connection: close`` from the client is answered with it, then the close."""
        conn = Connection(Door(b"x"))
        out = conn.send(b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n")
        self.assertIn(b"Connection: close\r\n", out)
        self.assertTrue(conn.closed)

    def test_answerAsksClose(self) -> None:
        """An answer carrying ``Connection: close`` closes the connection after it."""
        conn, request = answering()
        request.setHeader(b"connection", b"close")
        answer(request, b"x")
        self.assertTrue(conn.closed)

    def test_finishNotifies(self) -> None:
        """``notifyFinish`` fires when the answer is finished; writing after it is an error."""
        door = Door(hold=True)
        Connection(door).send(GET)
        request = door.requests[0]
        fired: list[object] = []
        request.notifyFinish().addCallback(fired.append)
        answer(request, b"x")
        self.assertEqual(fired, [None])
        self.assertRaises(RuntimeError, request.write, b"more")

    def test_producerRegisteredWithTransport(self) -> None:
        """A response body's producer is registered with the client transport."""
        conn, request = answering()
        producer = object()
        request.registerProducer(producer, True)
        self.assertIs(conn.transport.producer, producer)
        self.assertTrue(conn.transport.streaming)
        request.unregisterProducer()
        self.assertIsNone(conn.transport.producer)


class PersistenceTests(SynchronousTestCase):
    """Requests on one connection are answered in order, one at a time."""

    def test_sequentialRequests(self) -> None:
        """Two requests in a row on one connection are both answered."""
        door = Door(b"a")
        conn = Connection(door)
        first = conn.send(GET)
        second = conn.send(GET)
        self.assertEqual(len(door.requests), 2)
        self.assertTrue(first.endswith(b"a") and second.endswith(b"a"))

    def test_pipelinedWaitsForAnswer(self) -> None:
        """A pipelined request is handled only after the answer before it is finished."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(GET + b"POST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
        self.assertEqual(len(door.requests), 1)
        answer(door.requests[0], b"1")
        self.assertEqual(len(door.requests), 2)
        self.assertEqual(door.requests[1].content.getvalue(), b"hi")

    def test_pipelineHoldPausesReading(self) -> None:
        """Past ``PIPELINE_HOLD`` buffered bytes reading pauses, and resumes after the answer."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(GET)
        conn.send(b"x" * (PIPELINE_HOLD + 1))
        self.assertEqual(conn.transport.producerState, "paused")
        answer(door.requests[0], b"1")
        self.assertEqual(conn.transport.producerState, "producing")

    def test_synchronousAnswersDrainPipeline(self) -> None:
        """Three pipelined requests answered at once give three answers in order."""
        door = Door(b"z")
        conn = Connection(door)
        out = conn.send(GET * 3)
        self.assertEqual(out.count(b"HTTP/1.1 200 OK"), 3)
        self.assertEqual(len(door.requests), 3)


class LimitTests(SynchronousTestCase):
    """Bodies over ``maxBody``, heads over ``maxHeaderBytes``, and Expect."""

    def test_bodyTooLargeReadAndDropped(self) -> None:
        """A body over the limit is read to its end, not kept, and the request flagged."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        conn.send(b"POST /a HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + b"y" * 19)
        self.assertEqual(door.requests, [])
        conn.send(b"y")
        [request] = door.requests
        self.assertTrue(request.tooLarge)
        self.assertIsNone(request.content)

    def test_chunkedBodyGrowsTooLarge(self) -> None:
        """A chunked body growing past the limit is flagged and dropped."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        conn.send(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n")
        [request] = door.requests
        self.assertTrue(request.tooLarge)
        self.assertIsNone(request.content)

    def test_expectContinue(self) -> None:
        """``Expect: 100-continue`` within the limit gets ``100 Continue`` before the body."""
        door = Door(hold=True)
        conn = Connection(door)
        out = conn.send(b"POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        self.assertEqual(out, b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.send(b"ok")
        self.assertEqual(door.requests[0].content.getvalue(), b"ok")

    def test_expectContinueTooLarge(self) -> None:
        """An announced body over the limit is answered at once, without 100, then closed."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=10)
        out = conn.send(b"POST /a HTTP/1.1\r\nExpect: 100-continue\r\n"
                        b"Content-Length: 99\r\n\r\n")
        self.assertEqual(out, b"")
        [request] = door.requests
        self.assertTrue(request.tooLarge)
        answer(request, b"no")
        self.assertIn(b"Connection: close\r\n", conn.take())
        self.assertTrue(conn.closed)

    def test_headTooLarge(self) -> None:
        """A head over the limit, complete or not, is 431 and closes the connection."""
        for tail in (b"", b"\r\n\r\n"):
            conn = Connection(Door(), maxHeaderBytes=100)
            out = conn.send(b"GET / HTTP/1.1\r\nX: " + b"v" * 200 + tail)
            self.assertTrue(out.startswith(b"HTTP/1.1 431 "), out)
            self.assertTrue(conn.closed)

    def test_tooManyHeaders(self) -> None:
        """More than 500 header lines is 431."""
        conn = Connection(Door(), maxHeaderBytes=1 << 20)
        out = conn.send(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 501 + b"\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 431 "), out)


class BadRequestTests(SynchronousTestCase):
    """Framing the proxy cannot follow is 400 and the connection closes."""

    CASES = [
        b"GET / HTTP/1.1\nHost: x\r\n\r\n",  # bare LF
        b"GET /\r\n\r\n",  # no version
        b"GET / HTTP/2.0\r\n\r\n",  # unknown version
        b"G@T / HTTP/1.1\r\n\r\n",  # method not a token
        b"GET /a\x01b HTTP/1.1\r\n\r\n",  # control byte in target
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",  # space in a name
        b"GET / HTTP/1.1\r\nName : x\r\n\r\n",  # space before the colon
        b"GET / HTTP/1.1\r\n folded\r\n\r\n",  # obsolete line folding
        b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",  # NUL
        b"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
    ]

    def test_badFraming(self) -> None:
        """Each malformed request gets 400, is never handed to the door, and closes."""
        for raw in self.CASES:
            door = Door()
            conn = Connection(door)
            out = conn.send(raw)
            self.assertTrue(out.startswith(b"HTTP/1.1 400 "), (raw, out))
            self.assertEqual(door.requests, [], raw)
            self.assertTrue(conn.closed, raw)

    def test_knownNameWithoutColon(self) -> None:
        """A header name seen before is still refused on a line without a colon."""
        door = Door()
        conn = Connection(door)
        conn.send(GET)  # X-A is now a known name
        out = conn.send(b"GET / HTTP/1.1\r\nX-A\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 400 "), out)
        self.assertEqual(len(door.requests), 1)

    def test_doorCrashReported(self) -> None:
        """An exception from the door goes to its ``crashed`` with the request."""
        door = Door()
        door.handle = lambda request: 1 / 0  # type: ignore[method-assign]
        Connection(door).send(GET)
        self.assertEqual([type(e) for e in door.crashes], [ZeroDivisionError])


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
        conn.send(b"POST /a HTTP/1.1\r\nContent-Length: 10\r\n\r\n1")
        for _ in range(3):
            conn.clock.advance(4.0)
            conn.send(b"2")
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(5.5)
        self.assertTrue(conn.transport.disconnecting)

    def test_noDeadlineWhileAnswering(self) -> None:
        """A request being answered keeps its connection however long it takes."""
        door = Door(hold=True)
        conn = Connection(door, timeout=5.0)
        conn.send(GET)
        conn.clock.advance(3600.0)
        self.assertFalse(conn.transport.disconnecting)
        self.assertEqual(conn.site.slowClients, 0)


class DisconnectTests(SynchronousTestCase):
    """A client leaving mid-answer is seen by the request."""

    def test_clientGone(self) -> None:
        """The request learns of the loss: notifyFinish fails, writes are dropped."""
        conn, request = answering()
        failures: list[Any] = []
        request.notifyFinish().addErrback(failures.append)
        conn.channel.connectionLost()
        self.assertEqual(len(failures), 1)
        self.assertTrue(request._disconnected)
        request.write(b"dropped")
        self.assertEqual(conn.take(), b"")
        self.assertRaises(RuntimeError, request.finish)

    def test_whenLostCalledOnce(self) -> None:
        """``whenLost`` hears of a client gone mid-answer, with the reason."""
        conn, request = answering()
        reasons: list[Any] = []
        request.whenLost(reasons.append)
        conn.channel.connectionLost()
        self.assertEqual(len(reasons), 1)
        self.assertTrue(reasons[0].check(ConnectionDone))

    def test_whenLostNotAfterFinish(self) -> None:
        """Once the answer is finished, a later close is not a loss."""
        conn, request = answering()
        reasons: list[Any] = []
        request.whenLost(reasons.append)
        answer(request, b"x")
        conn.channel.connectionLost()
        self.assertEqual(reasons, [])
