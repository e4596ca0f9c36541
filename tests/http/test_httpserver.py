"""Unit tests of the facade's HTTP/1.1 server (``httpserver``, ``requestreader``,
``serverrequest``, ``site``); the RFC rules and refusals are in ``test_strictrequests``."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.engines import OLLAMA, Engine
from nvpair.proxy.http.interfaces import IDoor, IServerChannel, IServerRequest, ISite
from nvpair.proxy.http.server import PIPELINE_HOLD
from nvpair.proxy.http.site import FacadeSite
from nvpair.proxy.testing.wire import splitAnswer


@implementer(IDoor)
class Door:
    """Records requests (and their bodies); answers each with ``body`` at once unless
    ``hold`` is set."""

    engine: Engine | None = None

    def __init__(self, body: bytes = b"ok", hold: bool = False, length: bool = True) -> None:
        self.body = body
        self.hold = hold
        self.length = length
        self.requests: list[IServerRequest] = []
        self.bodies: list[bytes | None] = []
        self.crashes: list[Exception] = []

    def handle(self, request: IServerRequest) -> None:
        self.requests.append(request)
        self.bodies.append(None if request.content is None else request.content.getvalue())
        if not self.hold:
            answer(request, self.body, self.length)

    def crashed(self, request: IServerRequest, error: Exception) -> None:
        self.crashes.append(error)


class OllamaDoor(Door):
    """A door of the Ollama facade (its refusals use Ollama's error shape on ``/api/``)."""

    engine = OLLAMA


@implementer(IPushProducer)
class Producer:
    """A response body's producer that the test never asks anything of."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def answer(request: IServerRequest, body: bytes, length: bool = True) -> None:
    """Answer ``request`` with 200 and ``body``."""
    request.setResponseCode(200)
    if length:
        request.setHeader(b"content-length", b"%d" % len(body))
    request.write(body)
    request.finish()


class Connection:
    """A facade channel over a ``StringTransport`` with a fake clock."""

    def __init__(
        self, door: Door, maxBody: int = 1000, timeout: float = 30.0, maxHeaderBytes: int = 4096
    ) -> None:
        self.clock = Clock()
        self.site = FacadeSite(door, self.clock, maxBody, timeout, maxHeaderBytes)
        self.channel = self.site.buildProtocol(None)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def send(self, data: bytes) -> bytes:
        self.channel.dataReceived(data)
        return self.take()

    def take(self) -> bytes:
        out: bytes = self.transport.value()
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


GET = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\r\n"


def post(body: bytes, path: bytes = b"/a", extra: bytes = b"") -> bytes:
    """A POST with a Content-Length body."""
    return b"POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path,
        extra,
        len(body),
        body,
    )


def chunkedPost(chunks: bytes, extra: bytes = b"") -> bytes:
    """A POST with a chunked body given already framed."""
    return b"POST /a HTTP/1.1\r\nHost: h\r\n%sTransfer-Encoding: chunked\r\n\r\n%s" % (
        extra,
        chunks,
    )


def answering() -> tuple[Connection, IServerRequest]:
    """A connection whose door holds the ``GET`` it received, unanswered."""
    door = Door(hold=True)
    conn = Connection(door)
    conn.send(GET)
    return conn, door.requests[0]


def errorOf(out: bytes) -> tuple[int, dict[str, bytes], Any]:
    """The status, headers (lower-case names) and JSON body of one error answer."""
    status, fields, body = splitAnswer(out)
    headers = {name.decode(): value for name, value in fields.items()}
    assert len(body) == int(headers["content-length"]), out
    return status, headers, json.loads(body)


class RequestParsingTests(SynchronousTestCase):
    """A request head becomes the method, target, path and headers the door sees."""

    def test_requestSurface(self) -> None:
        """Method, uri, path, protocol and every header value (in order) reach the door."""
        door = Door()
        Connection(door).send(GET)
        [request] = door.requests
        self.assertEqual(
            (request.method, request.uri, request.path, request.clientproto),
            (b"GET", b"/v1/models?x=1", b"/v1/models", b"HTTP/1.1"),
        )
        self.assertEqual(request.requestHeaders.getRawHeaders(b"x-a"), [b"1", b"2"])
        self.assertEqual(request.getHeader(b"X-A"), b"2")
        self.assertIsNone(request.getHeader(b"absent"))
        self.assertEqual(door.bodies, [None])

    def test_valueWhitespaceTrimmed(self) -> None:
        """Whitespace around a value is not part of it; inside it is kept."""
        door = Door()
        Connection(door).send(b"GET / HTTP/1.1\r\nHost: h\r\nX-V: \t a  b \t \r\n\r\n")
        self.assertEqual(door.requests[0].getHeader(b"x-v"), b"a  b")

    def test_contentLengthBodyInPieces(self) -> None:
        """A body sent in pieces is handed over whole, once it has all arrived."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123")
        self.assertEqual(door.requests, [])
        conn.send(b"456")
        conn.send(b"789")
        self.assertEqual(door.bodies, [b"0123456789"])
        self.assertFalse(door.requests[0].tooLarge)

    @given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
    def test_chunkedBodyAnySplit(self, cuts: list[int]) -> None:
        """A chunked body with extensions and trailers decodes the same however it is split."""
        raw = chunkedPost(b"5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nX-Trailer: t\r\n\r\n")
        door = Door(hold=True)
        conn = Connection(door)
        at = 0
        for cut in cuts:
            conn.channel.dataReceived(raw[at : at + cut])
            at += cut
        conn.channel.dataReceived(raw[at:])
        self.assertEqual(door.bodies, [b"hello, world!!!"])
        self.assertIsNone(door.requests[0].getHeader(b"x-trailer"))

    def test_headByteByByte(self) -> None:
        """A head (after stray line ends) sent a byte at a time is one request."""
        door = Door(hold=True)
        conn = Connection(door)
        raw = b"\r\n" + GET
        for i in range(len(raw)):
            conn.channel.dataReceived(raw[i : i + 1])
        self.assertEqual(len(door.requests), 1)
        self.assertEqual(door.requests[0].uri, b"/v1/models?x=1")
        self.assertEqual(door.requests[0].getHeader(b"x-a"), b"2")

    def test_manySmallChunksInOneRead(self) -> None:
        """A thousand one-byte chunks in one read decode to the whole body."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=5000)
        body = bytes(range(256)) * 4
        chunks = b"".join(b"1\r\n%s\r\n" % body[i : i + 1] for i in range(len(body)))
        conn.send(chunkedPost(chunks + b"0\r\n\r\n") + GET)
        self.assertEqual(door.bodies, [body])
        answer(door.requests[0], b"x")
        self.assertEqual(door.requests[1].path, b"/v1/models")

    def test_strayLineEndsBeforeRequest(self) -> None:
        """Empty lines before a request line are ignored."""
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
        out = conn.send(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
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
        out = conn.send(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\n")
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
        producer = Producer()
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
        conn.send(GET + post(b"hi", b"/b"))
        self.assertEqual(len(door.requests), 1)
        answer(door.requests[0], b"1")
        self.assertEqual(len(door.requests), 2)
        self.assertEqual(door.bodies[1], b"hi")

    def test_pipelineHoldPausesReading(self) -> None:
        """Once the requests parsed ahead of the answer in progress pass ``PIPELINE_HOLD``
        bytes the transport is paused; it resumes when that answer ends."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=1 << 20)
        conn.send(GET)
        conn.send(post(b"y" * (PIPELINE_HOLD // 2)))
        self.assertEqual(conn.transport.producerState, "producing")
        conn.send(post(b"z" * (PIPELINE_HOLD // 2)))
        self.assertEqual(conn.transport.producerState, "paused")
        self.assertEqual(len(door.requests), 1)
        answer(door.requests[0], b"1")  # the next one is handed over and answering
        self.assertEqual(conn.transport.producerState, "producing")
        answer(door.requests[1], b"2")
        answer(door.requests[2], b"3")
        self.assertEqual(
            door.bodies[1:], [b"y" * (PIPELINE_HOLD // 2), b"z" * (PIPELINE_HOLD // 2)]
        )

    def test_pipelinedBodyPausesReading(self) -> None:
        """A large body of a request pipelined behind an answer pauses the transport."""
        door = Door(hold=True)
        conn = Connection(door, maxBody=1 << 22)
        conn.send(GET + b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 4000000\r\n\r\n")
        conn.send(b"b" * (PIPELINE_HOLD + 1))
        self.assertEqual(conn.transport.producerState, "paused")

    def test_synchronousAnswersDrainPipeline(self) -> None:
        """Many pipelined requests answered at once give as many answers, in order."""
        door = Door(b"z")
        conn = Connection(door)
        requests = [GET.replace(b"x=1", b"x=%d" % i) for i in range(2000)]
        out = conn.send(b"".join(requests))
        self.assertEqual(out.count(b"HTTP/1.1 200 OK"), 2000)
        self.assertEqual(
            [r.uri for r in door.requests], [b"/v1/models?x=%d" % i for i in range(2000)]
        )

    def test_closeStopsParsing(self) -> None:
        """After a request with ``Connection: close`` (or an HTTP/1.0 one) nothing more is
        parsed: the bytes after it are neither served nor answered 400."""
        for first in (
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
        ):
            door = Door()
            conn = Connection(door)
            out = conn.send(first + GET + b"garbage\r\n\r\n")
            self.assertEqual(len(door.requests), 1, first)
            self.assertEqual(out.count(b"HTTP/1."), 1, out)
            self.assertNotIn(b" 400 ", out)
            self.assertTrue(conn.closed)


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
        conn = Connection(Door(), maxHeaderBytes=1000)
        conn.send(b"GET / HTTP/1.1\r\nHost: h\r\nX: ")
        sent = b""
        for _ in range(200):
            sent += conn.send(b"v" * 10)
            if sent:
                break
        self.assertTrue(sent.startswith(b"HTTP/1.1 431 "), sent)

    def test_longTargetTrickled(self) -> None:
        """A request target that never ends is 431 too."""
        conn = Connection(Door(), maxHeaderBytes=1000)
        conn.send(b"GET /")
        sent = b""
        for _ in range(200):
            sent += conn.send(b"a" * 10)
            if sent:
                break
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


class DisconnectTests(SynchronousTestCase):
    """A client leaving mid-answer is seen by the request."""

    def test_clientGone(self) -> None:
        """The request learns of the loss: notifyFinish fails, writes are dropped."""
        conn, request = answering()
        failures: list[Failure] = []
        request.notifyFinish().addErrback(failures.append)
        conn.channel.connectionLost()
        self.assertEqual(len(failures), 1)
        request.write(b"dropped")
        self.assertEqual(conn.take(), b"")
        self.assertRaises(RuntimeError, request.finish)

    def test_whenLostCalledOnce(self) -> None:
        """``whenLost`` hears of a client gone mid-answer, with the reason."""
        conn, request = answering()
        reasons: list[Failure] = []
        request.whenLost(reasons.append)
        conn.channel.connectionLost()
        self.assertEqual(len(reasons), 1)
        self.assertTrue(reasons[0].check(ConnectionDone))

    def test_whenLostNotAfterFinish(self) -> None:
        """Once the answer is finished, a later close is not a loss."""
        conn, request = answering()
        reasons: list[Failure] = []
        request.whenLost(reasons.append)
        answer(request, b"x")
        conn.channel.connectionLost()
        self.assertEqual(reasons, [])

    def test_pipelinedDroppedOnLoss(self) -> None:
        """Requests queued behind the answer are never handed over once the client left."""
        door = Door(hold=True)
        conn = Connection(door)
        conn.send(GET + GET)
        conn.channel.connectionLost()
        self.assertEqual(len(door.requests), 1)


class SeamTests(SynchronousTestCase):
    """The fakes of this module, and the server side's own objects, provide the interfaces
    they stand for."""

    def test_fakesProvideTheirInterfaces(self) -> None:
        """The doors and the producer fakes are what they claim to be."""
        verifyObject(IDoor, Door())
        verifyObject(IDoor, OllamaDoor())
        verifyObject(IPushProducer, Producer())

    def test_serverSideProvidesItsSeams(self) -> None:
        """The site, a channel and a request provide what their callees expect of them."""
        conn, request = answering()
        verifyObject(ISite, conn.site)
        verifyObject(IServerChannel, conn.channel)
        verifyObject(IServerRequest, request)
