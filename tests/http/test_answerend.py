"""Bytes after a complete engine answer (issue 26): the answer stands exactly as framed, and
its connection is closed, never pooled, and counted.

The regression: ``204 No Content`` with a ``Content-Length`` and a whole second response in
the same read reached the client as ``200 No ContentOK``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.testing import StringTransport
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse

from nvpair.proxy.http.answer import DONE, OVERRUN
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.framing import serializeRequest
from nvpair.proxy.http.pool import ConnectionPool
from tests.http.httpkit import KEY, Body, ClientCase, FakeEndpoint

SECOND = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"
NO_CONTENT = b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"

# What a client sees of one answer: status, phrase, header fields, length, body, ending.
Seen = tuple[int, bytes, list[tuple[bytes, list[bytes]]], object, bytes, bool]


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` cut at ``points`` (positions taken modulo its length + 1), in order."""
    at = sorted({p % (len(raw) + 1) for p in points})
    edges = [0, *at, len(raw)]
    return [raw[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def deliver(
    pool: ConnectionPool, reads: list[bytes], method: bytes
) -> tuple[Seen | None, HTTPClientConnection, StringTransport]:
    """One request over a new connection of ``pool``, ``reads`` fed as the engine's reads;
    what the client saw (None if nothing), the connection and its transport."""
    endpoint = FakeEndpoint()
    data = serializeRequest(method, b"/v1/x", b"e:1", Headers(), None)
    d: defer.Deferred[IResponse] = pool.request(KEY, endpoint, data, method)
    conn, transport = endpoint.complete()
    body = Body()
    got: list[IResponse] = []

    def take(response: IResponse) -> None:
        got.append(response)
        response.deliverBody(body)

    d.addCallback(take)
    for read in reads:
        conn.dataReceived(read)
    if not got:
        return None, conn, transport
    response = got[0]
    fields = sorted(response.headers.getAllRawHeaders())
    done = body.reason is not None and body.reason.check(ResponseDone) is not None
    seen = (response.code, response.phrase, fields, response.length, b"".join(body.data), done)
    return seen, conn, transport


class BodilessAnswerTests(ClientCase):
    """The answers whose framing says "no body", with bytes after them."""

    def assertClosedAndCounted(self, transport: StringTransport) -> None:
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool.connectionCounts(), (0, 0))
        self.assertEqual(self.pool.answersOverrun, 1)

    def test_noContentThenASecondResponse(self) -> None:
        """The regression: 204 with a Content-Length, then a whole 200 in the same read:
        the client sees exactly the 204, with no body, and the connection is closed."""
        seen, conn, transport = deliver(self.pool, [NO_CONTENT + SECOND], b"GET")
        self.assertEqual(seen, (204, b"No Content", [], UNKNOWN_LENGTH, b"", True))
        self.assertIs(conn.answer, OVERRUN)
        self.assertClosedAndCounted(transport)

    def test_notModifiedThenBytes(self) -> None:
        """304 with a Content-Length, then bytes: the 304 with the engine's length."""
        raw = b'HTTP/1.1 304 Not Modified\r\nETag: "a"\r\nContent-Length: 7\r\n\r\n'
        seen, _, transport = deliver(self.pool, [raw + b"garbage"], b"GET")
        assert seen is not None
        self.assertEqual(seen[:2], (304, b"Not Modified"))
        self.assertEqual((seen[3], seen[4], seen[5]), (7, b"", True))
        self.assertClosedAndCounted(transport)

    def test_headAnswerThenBytes(self) -> None:
        """A HEAD answer announcing 5 bytes, and 5 bytes after it: none is body."""
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        seen, _, transport = deliver(self.pool, [raw + b"hello"], b"HEAD")
        assert seen is not None
        self.assertEqual((seen[0], seen[3], seen[4], seen[5]), (200, 5, b"", True))
        self.assertClosedAndCounted(transport)

    def test_onlyLineEndsAfter(self) -> None:
        """A CR LF after the answer (llhttp skips it without a callback) is still bytes
        after the answer."""
        for tail in (b"\r\n", b"\n", b"\r", b"\r\n\r\n"):
            self.pool = ConnectionPool(self.clock)
            raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            seen, _, transport = deliver(self.pool, [raw + tail], b"GET")
            assert seen is not None
            self.assertEqual(seen[4], b"ok")
            self.assertClosedAndCounted(transport)

    def test_bytesInALaterRead(self) -> None:
        """Bytes after the answer in a later read, once the connection was pooled: it is
        taken out of the pool at once, aborted and counted."""
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        seen, conn, transport = deliver(self.pool, [raw], b"GET")
        self.assertIs(conn.answer, DONE)
        self.assertEqual(self.pool.connectionCounts(), (1, 1))
        conn.dataReceived(SECOND)
        self.assertTrue(transport.disconnected)
        self.assertEqual(self.pool.connectionCounts(), (0, 0))
        self.assertEqual(self.pool.answersOverrun, 1)
        conn.dataReceived(b"more")
        self.assertEqual(self.pool.answersOverrun, 1, "counted once per answer")

    def test_cleanAnswerPooledNotCounted(self) -> None:
        """Without bytes after it, a keep-alive answer ending with a line end is pooled."""
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        seen, _, transport = deliver(self.pool, [raw], b"GET")
        assert seen is not None
        self.assertEqual((seen[4], seen[5]), (b"ok", True))
        self.assertFalse(transport.disconnecting)
        self.assertEqual(self.pool.connectionCounts(), (1, 1))
        self.assertEqual(self.pool.answersOverrun, 0)


_TOKEN = st.sampled_from([b"X-A", b"Content-Type", b"X-Request-Id", b"Cache-Control", b"ETag"])
_VALUE = st.from_regex(rb"\A[!-~]([ -~]{0,20}[!-~])?\Z")


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A valid engine answer and the method it answers: 1xx interims optional, any of the
    bodiless kinds (204, 304, HEAD, with or without a Content-Length), a Content-Length
    or a chunked body, kept alive or not."""
    method = draw(st.sampled_from([b"GET", b"POST", b"HEAD"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 404, 500]))
    phrase = draw(st.sampled_from([b"OK", b"No Content", b"Whatever It Is", b""]))
    fields = draw(st.lists(st.tuples(_TOKEN, _VALUE), max_size=4))
    body = draw(st.binary(max_size=40))
    head = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    head += b"".join(b"%s: %s\r\n" % field for field in fields)
    if draw(st.booleans()):
        head += b"Connection: close\r\n"
    bodiless = method == b"HEAD" or status in (204, 304)
    if bodiless:
        if draw(st.booleans()):
            head += b"Content-Length: %d\r\n" % draw(st.integers(0, 99))
        raw = head + b"\r\n"
    elif draw(st.booleans()):
        raw = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    else:
        pieces = cut(body, draw(st.lists(st.integers(0, 40), max_size=3)))
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        raw = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    if draw(st.booleans()):
        raw = b"HTTP/1.1 100 Continue\r\n\r\n" + raw
    return method, raw


_TAILS = st.one_of(
    st.binary(min_size=1, max_size=60),
    st.sampled_from([SECOND, NO_CONTENT + SECOND, b"\r\n", b"\n", b"HTTP/1.1 2"]),
)


class AnswerEndProperties(ClientCase):
    """Any valid answer followed by any bytes, cut anywhere, is delivered exactly."""

    @settings(max_examples=300, deadline=None)
    @given(answers(), _TAILS, st.lists(st.integers(0, 1 << 16), max_size=6))
    def test_bytesAfterNeverChangeTheAnswer(
        self, answer: tuple[bytes, bytes], tail: bytes, points: list[int]
    ) -> None:
        """The answer and its tail, cut at any points: exactly what the answer alone gives
        (status, phrase, fields, length, body, a clean end), the connection closed, never
        pooled, and counted once."""
        method, raw = answer
        alone, _, _ = deliver(ConnectionPool(self.clock), [raw], method)
        assert alone is not None and alone[5], alone
        pool = ConnectionPool(self.clock)
        seen, conn, transport = deliver(pool, cut(raw + tail, points), method)
        self.assertEqual(seen, alone)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(pool.connectionCounts(), (0, 0))
        self.assertIsNot(conn.answer, DONE)
        self.assertEqual(pool.answersOverrun, 1)
