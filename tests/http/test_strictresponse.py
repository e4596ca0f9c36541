"""The RFC 9110/9112 rules the upstream client holds engine responses to (issue 15).

Each malformed answer fails the request (or, once its head was handed out, the body) with
``ResponseFailed``, never ends as ``ResponseDone``, and its connection is aborted and never
pooled again.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.proxy.http.framing import BadResponse, serializeRequest
from nvpair.proxy.http.pool import ConnectionPool
from tests.http.httpkit import KEY, Body, FakeEndpoint

OK = b"HTTP/1.1 200 OK\r\n"
CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"

# Answers no client may receive as a success: (what is wrong, the bytes).
MALFORMED = [
    ("signed length", OK + b"Content-Length: +256\r\n\r\nx"),
    ("length with an underscore", OK + b"Content-Length: 2_62\r\n\r\nx"),
    ("length after a vertical tab", OK + b"Content-Length: \x0b12\r\n\r\nx"),
    ("two lengths in one field", OK + b"Content-Length: 1,2\r\n\r\nx"),
    ("a length with a space inside", OK + b"Content-Length: 1 2\r\n\r\nx"),
    ("differing length fields", OK + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nx"),
    ("negative length", OK + b"Content-Length: -1\r\n\r\nx"),
    ("hex length", OK + b"Content-Length: 0x10\r\n\r\nx"),
    ("length overflowing 64 bits", OK + b"Content-Length: 99999999999999999999\r\n\r\n"),
    (
        "length and chunked",
        OK + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    ),
    ("chunk size not hex", CHUNKED + b"zz\r\nhi\r\n0\r\n\r\n"),
    ("signed chunk size", CHUNKED + b"+2\r\nhi\r\n0\r\n\r\n"),
    ("chunk size with bare LF", CHUNKED + b"2\nhi\r\n0\r\n\r\n"),
    ("chunk data longer than its size", CHUNKED + b"1\r\nhi\r\n0\r\n\r\n"),
    ("chunk size overflowing 64 bits", CHUNKED + b"11111111111111111\r\nx"),
    (
        "bare CR in a header value",
        OK + b"X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\nx",
    ),
    ("bare LF line ends", b"HTTP/1.1 200 OK\nContent-Length: 1\n\nx"),
    ("obsolete line folding", OK + b"X-A: a\r\n b\r\nContent-Length: 1\r\n\r\nx"),
    ("space before the colon", OK + b"Content-Length : 1\r\n\r\nx"),
    ("space inside a name", OK + b"Bad Name: x\r\nContent-Length: 1\r\n\r\nx"),
    ("NUL in a value", OK + b"X-A: a\x00b\r\nContent-Length: 1\r\n\r\nx"),
    ("status of four digits", b"HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\nx"),
    ("not HTTP", b"SSH-2.0-OpenSSH\r\n\r\n"),
    ("a transfer coding we cannot decode", OK + b"Transfer-Encoding: gzip\r\n\r\nabc"),
    ("chunked, then another coding", OK + b"Transfer-Encoding: chunked, gzip\r\n\r\nabc"),
    (
        "a protocol switch nobody asked for",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
    ),
]


class StrictResponseTests(SynchronousTestCase):
    """Engine answers are parsed strictly; the relayed fields follow RFC 9110 §7.6.1."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.pool = ConnectionPool(self.clock, maxPersistentPerHost=2, idleTimeout=90)
        self.endpoint = FakeEndpoint()

    def exchange(
        self, reads: list[bytes], method: bytes = b"GET"
    ) -> tuple[defer.Deferred[IResponse], StringTransport, Body]:
        """Send a request, feed ``reads``; (the request's Deferred, its transport, the body
        protocol the response was delivered to if there was one)."""
        data = serializeRequest(method, b"/v1/x", b"e:1", Headers(), None)
        d = self.pool.request(KEY, self.endpoint, data, method)
        conn, transport = self.endpoint.complete()
        body = Body()

        def deliver(response: IResponse) -> IResponse:
            response.deliverBody(body)
            return response

        d.addCallback(deliver)
        for read in reads:
            conn.dataReceived(read)
        return d, transport, body

    def assertRefused(self, reads: list[bytes], what: str) -> None:
        """The answer in ``reads`` fails (request or body), never ends clean, and its
        connection is aborted and not pooled."""
        d, transport, body = self.exchange(reads)
        if body.reason is None:
            failure = self.failureResultOf(d, ResponseFailed)
        else:
            failure = body.reason
            self.assertTrue(failure.check(ResponseFailed), what)
        self.assertIsInstance(failure.value.reasons[0].value, BadResponse, what)
        self.assertTrue(transport.disconnecting, what)
        self.assertEqual(self.pool.connectionCounts(), (0, 0), what)

    def test_malformedAnswersRefused(self) -> None:
        """Every malformed answer in MALFORMED is refused, whole or split after its head."""
        for what, raw in MALFORMED:
            self.assertRefused([raw], what)
            end = raw.find(b"\r\n\r\n")
            if end > 0:
                self.assertRefused([raw[: end + 4], raw[end + 4 :]], what + " (split)")

    def test_malformedBytewise(self) -> None:
        """Byte by byte, the same malformed answers are refused the same way."""
        for what, raw in MALFORMED:
            self.assertRefused([raw[i : i + 1] for i in range(len(raw))], what + " (bytewise)")

    def test_bareCRCannotInjectAField(self) -> None:
        """A value with a bare CR is an error, not a line break: no injected field."""
        d, transport, _ = self.exchange(
            [OK + b"X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nhi"]
        )
        failure = self.failureResultOf(d, ResponseFailed)
        self.assertIn("LF", str(failure.value.reasons[0].value))
        self.assertTrue(transport.disconnecting)

    def test_validLengthsAccepted(self) -> None:
        """Digits only, whitespace around the value allowed (it is not part of it)."""
        for value in (b"3", b"003", b" 3 ", b"\t3"):
            d, transport, body = self.exchange([OK + b"Content-Length: " + value + b"\r\n\r\nabc"])
            response = self.successResultOf(d)
            self.assertEqual(response.length, 3, value)
            self.assertEqual(b"".join(body.data), b"abc")
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.pool._connections.clear()

    def test_hopByHopFieldsNotOnTheResponse(self) -> None:
        """Connection and what it names, Keep-Alive, Proxy-Connection, TE, Trailer,
        Transfer-Encoding and Upgrade are not among the response's headers; end-to-end
        fields are, values without trailing whitespace."""
        d, _, body = self.exchange(
            [
                OK + b"Connection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\n"
                b"Proxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-Sum\r\n"
                b"Upgrade: websocket\r\nX-Secret: s\r\nX-Public: p  \r\nContent-Type: a/b\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX-Sum: 1\r\n\r\n"
            ]
        )
        response = self.successResultOf(d)
        self.assertEqual(
            sorted(response.headers.getAllRawHeaders()),
            [
                (b"Content-Type", [b"a/b"]),
                (b"X-Public", [b"p"]),
            ],
        )
        self.assertEqual(body.data, [b"x"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(self.pool.connectionCounts(), (1, 1))

    def test_upgradeAdvertisedOnA200(self) -> None:
        """A 200 that advertises an upgrade (as Apache does: `Upgrade: h2,h2c`,
        `Connection: Upgrade, Keep-Alive`) is an ordinary answer; Upgrade is not relayed."""
        d, transport, body = self.exchange(
            [
                OK + b"Upgrade: h2,h2c\r\nConnection: Upgrade, Keep-Alive\r\n"
                b"Content-Length: 2\r\n\r\nhi"
            ]
        )
        response = self.successResultOf(d)
        self.assertEqual(list(response.headers.getAllRawHeaders()), [])
        self.assertEqual(body.data, [b"hi"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))

    def test_bytesAfterALengthBody(self) -> None:
        """Garbage after a complete Content-Length answer: that answer stands (it was
        framed), the connection is closed and not pooled."""
        d, transport, body = self.exchange([OK + b"Content-Length: 1\r\n\r\nxGARBAGE"])
        self.successResultOf(d)
        self.assertEqual(body.data, [b"x"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool.connectionCounts(), (0, 0))

    def test_closeDelimitedEnds(self) -> None:
        """A close-delimited body ends clean (PotentialDataLoss) only on a clean close; a
        reset is a failure."""
        for reason, clean in ((ConnectionDone(), True), (ConnectionLost(), False)):
            d, transport, body = self.exchange([OK + b"\r\nabc"])
            self.endpoint.conns[-1].connectionLost(Failure(reason))
            assert body.reason is not None
            self.assertEqual(bool(body.reason.check(PotentialDataLoss)), clean)
            self.assertEqual(bool(body.reason.check(ResponseFailed)), not clean)
            self.assertEqual(b"".join(body.data), b"abc")

    def test_http10NotPooled(self) -> None:
        """An HTTP/1.0 answer without keep-alive is not pooled; with it, it is."""
        for extra, pooled in ((b"", (0, 0)), (b"Connection: keep-alive\r\n", (1, 1))):
            self.pool._connections.clear()
            d, transport, body = self.exchange(
                [b"HTTP/1.0 200 OK\r\n" + extra + b"Content-Length: 1\r\n\r\nx"]
            )
            self.successResultOf(d)
            self.assertEqual(self.pool.connectionCounts(), pooled)

    def test_interimThenFinal(self) -> None:
        """Several 1xx answers (with fields) are skipped; the final one's fields only."""
        d, _, body = self.exchange(
            [
                b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\n",
                b"X-Final: 1\r\nContent-Length: 0\r\n\r\n",
            ]
        )
        response = self.successResultOf(d)
        self.assertEqual((response.code, response.phrase), (201, b"Created"))
        self.assertEqual([n for n, _ in response.headers.getAllRawHeaders()], [b"X-Final"])

    def test_headLengthNotPooled(self) -> None:
        """A HEAD answer is handed out with the engine's length at once, whatever
        follows it; the connection is not reused."""
        d, transport, body = self.exchange([OK + b"Content-Length: 256\r\n\r\n"], method=b"HEAD")
        response = self.successResultOf(d)
        self.assertEqual(response.length, 256)
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertTrue(transport.disconnecting)

    def test_stoppedBodyIgnoresLaterBytes(self) -> None:
        """After the body protocol stopped the body, bytes still arriving reach nobody."""
        d, transport, body = self.exchange([CHUNKED + b"1\r\na\r\n"])
        IPushProducer(body.transport).stopProducing()
        self.endpoint.conns[-1].dataReceived(b"1\r\nb\r\n")
        self.assertEqual(body.data, [b"a"])
        self.assertTrue(transport.disconnecting)

    def test_unexpectedDataWhileIdleAborts(self) -> None:
        """Bytes on a pooled connection nobody asked for abort it."""
        d, transport, _ = self.exchange([OK + b"Content-Length: 0\r\n\r\n"])
        self.assertEqual(self.pool.connectionCounts(), (1, 1))
        self.endpoint.conns[-1].dataReceived(b"HTTP/1.1 200 OK\r\n")
        self.assertTrue(transport.disconnecting)

    def test_requestFailsWhenLostDuringInterim(self) -> None:
        """A connection lost after only an interim answer fails the request."""
        d, _, _ = self.exchange([b"HTTP/1.1 100 Continue\r\n\r\n"])
        self.endpoint.conns[-1].connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(d)
