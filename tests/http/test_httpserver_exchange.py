"""Unit tests of the facade's HTTP/1.1 server (``httpserver``, ``requestreader``,
``serverrequest``, ``site``) on one connection: how a request head and body are parsed, how
answers are framed, persistence and pipelining, a client gone mid-answer, and the server
side's seams. Size limits, ``Expect`` and deadlines are in ``test_httpserver_limits``; the
RFC rules and refusals are in ``test_strictrequests``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.http.interfaces import IDoor, IServerChannel, IServerRequest, ISite
from nvpair.proxy.http.server import PIPELINE_HOLD
from tests.http.httpkit import (
    GET,
    Connection,
    Door,
    OllamaDoor,
    Producer,
    answer,
    answering,
    chunkedPost,
    post,
)


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
    """The server side's fakes (in ``httpkit``) and its own objects provide the interfaces
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
