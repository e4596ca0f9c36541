"""Unit tests of how the lean upstream HTTP/1.1 client (``nvpair.proxy.http.client``)
reads engine answers: Content-Length, chunked and close-delimited bodies cut anywhere,
bodiless and interim answers, and malformed or oversized heads and framing. Pooling and
dialling are in ``test_httpclient_pool``; the RFC rules answers are held to are in
``test_strictresponse``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH

from nvpair.proxy.http.framing import MAX_BODY_OVERHEAD, MAX_HEAD
from tests.http.httpkit import KEY, Body, ClientCase


def frame(payload: bytes, size: bytes | None = None) -> bytes:
    """One chunk: its size line (``size`` as given, else lower-case hex), data and CRLF."""
    return b"%s\r\n%s\r\n" % (b"%x" % len(payload) if size is None else size, payload)


def sseBody(events: int = 50) -> tuple[bytes, bytes]:
    """A streamed chat answer as an engine frames it: the chunked body and its payload."""
    pieces = [
        b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"},"finish_reason":null}]}\n\n' % i
        for i in range(events)
    ]
    pieces.append(b"data: [DONE]\n\n")
    return b"".join(frame(p) for p in pieces) + b"0\r\n\r\n", b"".join(pieces)


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` cut at ``points`` (any order, repeats allowed: empty reads)."""
    bounds = [0, *sorted(p % (len(raw) + 1) for p in points), len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


_SIZES = st.one_of(st.integers(1, 20), st.sampled_from([0xBA, 0xFF, 0x100, 0x1FF]))
_DATA = st.sampled_from(b"a\r\n;0")


@st.composite
def chunkedBodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A valid chunked body (sizes in any hex form, extensions, trailers) and its payload."""
    raw, payload = [], []
    for size in draw(st.lists(_SIZES, max_size=12)):
        pattern = bytes(draw(st.lists(_DATA, min_size=1, max_size=6)))
        data = (pattern * size)[:size]
        line = draw(st.sampled_from([b"%x", b"%X", b"0%x"])) % size
        line += draw(st.sampled_from([b""] * 4 + [b";a=b", b";x"]))
        raw.append(line + b"\r\n" + data + b"\r\n")
        payload.append(data)
    raw.append(b"0\r\n" + draw(st.sampled_from([b"", b"T: 1\r\n", b"A: b\r\nC: d\r\n"])) + b"\r\n")
    return b"".join(raw), b"".join(payload)


class ClientTests(ClientCase):
    """Byte-level framing of the answers a pooled connection reads."""

    def test_contentLength(self) -> None:
        """A Content-Length body is delivered whole, ends clean and the connection is pooled."""
        response, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-B: y\r\n\r\nhello"
        )
        self.assertEqual((response.code, response.phrase, response.length), (200, b"OK", 5))
        self.assertEqual(response.headers.getRawHeaders(b"x-b"), [b"y"])
        self.assertIsNone(response.headers.getRawHeaders(b"content-length"))
        self.assertEqual(b"".join(body.data), b"hello")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(len(self.pool._connections[KEY]), 1)
        self.assertFalse(transport.disconnecting)

    def test_chunkedAcrossBoundaries(self) -> None:
        """Chunk sizes, payloads and CRLFs split anywhere decode to the same body."""
        d = self.send()
        conn, _ = self.endpoint.complete()
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"
        )
        body = Body()
        for i in range(len(raw)):
            conn.dataReceived(raw[i : i + 1])
            if i == raw.index(b"\r\n\r\n") + 3:
                response = self.successResultOf(d)
                self.assertIs(response.length, UNKNOWN_LENGTH)
                response.deliverBody(body)
        self.assertEqual(b"".join(body.data), b"hello world")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(len(self.pool._connections[KEY]), 1)

    def test_chunksOfOneReadCoalesced(self) -> None:
        """The chunk payloads of one read reach the body protocol as one dataReceived."""
        _, body, _ = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n"
        )
        self.assertEqual(body.data, [b"abcd"])
        self.assertIsNone(body.reason)

    def test_earlyCloseContentLength(self) -> None:
        """A body cut short of its Content-Length ends as ResponseFailed."""
        _, body, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhel")
        self.connectionOf(transport).connectionLost(Failure(ConnectionDone()))
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertEqual(body.data, [b"hel"])

    def test_closeDelimited(self) -> None:
        """A body without length ends at close as PotentialDataLoss and is not pooled."""
        response, body, transport = self.respond(b"HTTP/1.1 200 OK\r\n\r\nabc")
        self.assertIs(response.length, UNKNOWN_LENGTH)
        self.connectionOf(transport).connectionLost(Failure(ConnectionDone()))
        assert body.reason is not None
        self.assertTrue(body.reason.check(PotentialDataLoss))
        self.assertEqual(self.pool._connections, {})

    def test_noBodyResponses(self) -> None:
        """204 and 304 answers have no body and keep the connection; a 304's length is the
        engine's Content-Length, a 204 has none."""
        for raw, length in (
            (b"HTTP/1.1 204 No Content\r\n\r\n", UNKNOWN_LENGTH),
            (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", 7),
        ):
            self.pool._connections.clear()
            response, body, transport = self.respond(raw, b"GET")
            self.assertEqual(response.length, length)
            self.assertEqual(body.data, [])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertFalse(transport.disconnecting)
            self.assertEqual(self.pool.connectionCounts(), (1, 1))

    def test_headAnswerCarriesTheEnginesLength(self) -> None:
        """A HEAD answer ends at its head with the engine's Content-Length as its length
        (not 0); llhttp would wait for a body, so the connection is closed, not pooled."""
        for raw, length, xb in (
            (b"HTTP/1.1 200 OK\r\nContent-Length: 256\r\nX-B: y\r\n\r\n", 256, [b"y"]),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", UNKNOWN_LENGTH, None),
        ):
            response, body, transport = self.respond(raw, b"HEAD")
            self.assertEqual((response.code, response.length), (200, length))
            self.assertEqual(response.headers.getRawHeaders(b"x-b"), xb)
            self.assertIsNone(response.headers.getRawHeaders(b"content-length"))
            self.assertEqual(body.data, [])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertTrue(transport.disconnecting)
            self.assertEqual(self.pool.connectionCounts(), (0, 0))

    def test_interimSkipped(self) -> None:
        """A 1xx interim answer is skipped."""
        response, body, _ = self.respond(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(body.data, [b"x"])

    def test_badChunkSize(self) -> None:
        """A malformed chunk size after the head was handed out fails the body and aborts
        the connection; in the head's own read it fails the request instead."""
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        _, body, transport = self.respond(head)
        self.connectionOf(transport).dataReceived(b"zz\r\n")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertTrue(transport.disconnecting)
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(head + b"zz\r\n")
        self.failureResultOf(d, ResponseFailed)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool.connectionCounts(), (0, 0))

    def test_badStatusLine(self) -> None:
        """A response that is not HTTP fails the request."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(b"SSH-2.0-x\r\n\r\n")
        self.failureResultOf(d, ResponseFailed)
        self.assertTrue(transport.disconnecting)

    def test_sseBodyInOneRead(self) -> None:
        """A 50-event chunked stream arriving with its head in one read reaches the body
        protocol as one dataReceived, ends clean and the connection is pooled."""
        raw, payload = sseBody()
        for _ in range(2):  # the second time over the pooled connection
            self.pool._connections.clear()
            _, body, transport = self.respond(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + raw
            )
            self.assertEqual(body.data, [payload])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertEqual(self.pool._connections[KEY], [self.connectionOf(transport)])

    def test_everyCutOfAJsonAnswer(self) -> None:
        """A head and Content-Length body cut into two reads anywhere: the same answer."""
        raw = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10"
            b'\r\nX-B: y\r\n\r\n{"a": "b"}'
        )
        for at in range(len(raw) + 1):
            self.pool._connections.clear()
            d = self.send()
            conn, transport = self.endpoint.complete()
            conn.dataReceived(raw[:at])
            conn.dataReceived(raw[at:])
            response = self.successResultOf(d)
            body = Body()
            response.deliverBody(body)
            self.assertEqual((response.code, response.length), (200, 10))
            self.assertEqual(response.headers.getRawHeaders(b"x-b"), [b"y"])
            self.assertEqual(b"".join(body.data), b'{"a": "b"}')
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone), at)
            self.assertEqual(self.pool._connections[KEY], [conn])

    @settings(max_examples=100)
    @given(chunkedBodies(), st.lists(st.integers(0, 10_000), max_size=6))
    def test_chunkedCutsProperty(self, chunked: tuple[bytes, bytes], points: list[int]) -> None:
        """A chunked answer cut anywhere: its payload, at most one dataReceived per read, a
        clean end and the connection pooled."""
        raw, payload = chunked
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + raw
        self.pool._connections.clear()
        d = self.send()
        conn, _ = self.endpoint.complete()
        body = Body()
        d.addCallback(lambda response: response.deliverBody(body))
        reads = cut(raw, points)
        for piece in reads:
            conn.dataReceived(piece)
        self.assertEqual(b"".join(body.data), payload)
        self.assertLessEqual(len(body.data), len(reads))
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(self.pool._connections[KEY], [conn])

    def test_bytesAfterTheBodyClose(self) -> None:
        """Bytes after a chunked body's end (nobody asked for them): the body ends clean but
        the connection is closed, not pooled."""
        _, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\nX"
        )
        self.assertEqual(body.data, [b"ab"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool._connections, {})

    def test_headTooLarge(self) -> None:
        """A head growing past MAX_HEAD without its end fails the request and aborts."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(b"HTTP/1.1 200 OK\r\n")
        self.assertNoResult(d)
        conn.dataReceived(b"X-A: " + b"a" * MAX_HEAD)
        failure = self.failureResultOf(d, ResponseFailed)
        self.assertIn("too large", str(failure.value.reasons[0].value))
        self.assertTrue(transport.disconnecting)

    def test_framingWithoutPayloadBounded(self) -> None:
        """Framing bytes (a chunk extension, trailers) growing past MAX_BODY_OVERHEAD
        without a payload byte fail the body and abort the connection."""
        for tail in (b"1;" + b"a" * MAX_BODY_OVERHEAD, b"0\r\nT: " + b"a" * MAX_BODY_OVERHEAD):
            _, body, transport = self.respond(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n"
            )
            self.connectionOf(transport).dataReceived(tail[:1000])
            self.assertIsNone(body.reason)
            self.connectionOf(transport).dataReceived(tail[1000:])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseFailed))
            self.assertEqual(body.data, [b"x"])
            self.assertTrue(transport.disconnecting)

    def test_errorDropsTheFailingRead(self) -> None:
        """A framing error fails the body; payload of the failing read is not delivered."""
        _, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        )
        self.connectionOf(transport).dataReceived(b"1\r\nc\r\n1\r\nxY\r\n")
        self.assertEqual(body.data, [b"ab"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertTrue(transport.disconnecting)
