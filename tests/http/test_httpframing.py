"""Unit tests of the upstream client's head rules (``nvpair.proxy.http.framing``)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from nvpair.proxy.http.framing import headerKey, isToken, responseHead, serializeRequest


def fields(*pairs: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """Header fields as llhttp reports them."""
    return list(pairs)


class ResponseHeadTests(SynchronousTestCase):
    """Which fields of an engine's head reach the client, and its framing facts."""

    def test_endToEndKeptInOrder(self) -> None:
        """End-to-end fields are kept (names canonical, repeats in order, trailing
        whitespace removed); Content-Length is the length, not a header."""
        head = responseHead(
            200,
            b"OK",
            fields(
                (b"content-type", b"application/json"),
                (b"Content-Length", b"12"),
                (b"X-A", b"1"),
                (b"x-a", b"2 \t"),
                (b"ETAG", b'"v"'),
            ),
        )
        self.assertEqual((head.code, head.phrase, head.contentLength), (200, b"OK", 12))
        self.assertEqual(
            sorted(head.headers.getAllRawHeaders()),
            [
                (b"Content-Type", [b"application/json"]),
                (b"ETag", [b'"v"']),
                (b"X-A", [b"1", b"2"]),
            ],
        )
        self.assertIsNone(head.transferEncoding)

    def test_hopByHopRemoved(self) -> None:
        """Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding and
        Upgrade never reach the response's headers."""
        head = responseHead(
            200,
            b"OK",
            fields(
                (b"Connection", b"keep-alive"),
                (b"Keep-Alive", b"timeout=5"),
                (b"Proxy-Connection", b"keep-alive"),
                (b"TE", b"trailers"),
                (b"Trailer", b"X-Checksum"),
                (b"Transfer-Encoding", b"chunked"),
                (b"Upgrade", b"h2c"),
                (b"X-Kept", b"yes"),
            ),
        )
        self.assertEqual(list(head.headers.getAllRawHeaders()), [(b"X-Kept", [b"yes"])])
        self.assertEqual(head.transferEncoding, b"chunked")

    def test_fieldsNamedByConnectionRemoved(self) -> None:
        """Every field a Connection header names (any case, any of several headers) goes."""
        head = responseHead(
            200,
            b"OK",
            fields(
                (b"Connection", b"X-Secret, close"),
                (b"connection", b"x-other"),
                (b"X-Secret", b"s"),
                (b"X-Other", b"o"),
                (b"X-Public", b"p"),
            ),
        )
        self.assertEqual(list(head.headers.getAllRawHeaders()), [(b"X-Public", [b"p"])])

    def test_transferCodingsJoined(self) -> None:
        """The transfer codings of every Transfer-Encoding field, lower case, in order."""
        head = responseHead(
            200,
            b"OK",
            fields(
                (b"Transfer-Encoding", b"gzip "),
                (b"transfer-encoding", b"Chunked"),
            ),
        )
        self.assertEqual(head.transferEncoding, b"gzip,chunked")


class NameTests(SynchronousTestCase):
    """Tokens and the canonical keys of header names."""

    def test_tokens(self) -> None:
        """Methods and names are tokens; spaces, separators and controls are not."""
        for good in (b"GET", b"X-A", b"a.b_c~1"):
            self.assertTrue(isToken(good), good)
        for bad in (b"", b"Bad Name", b"a:b", b"a\x00", b"\xe9", b"a\r"):
            self.assertFalse(isToken(bad), bad)

    def test_headerKey(self) -> None:
        """A name's key is the capitalization ``Headers`` files it under; a non-token is a
        ValueError."""
        self.assertEqual(headerKey(b"content-type"), b"Content-Type")
        self.assertEqual(headerKey(b"etag"), b"ETag")
        self.assertRaises(ValueError, headerKey, b"Bad Name")


class SerializeTests(SynchronousTestCase):
    """The request's bytes."""

    def test_withAndWithoutBody(self) -> None:
        """Host first, headers as given, and a Content-Length only when a body is sent."""
        headers = Headers({b"X-A": [b"1", b"2"]})
        self.assertEqual(
            serializeRequest(b"POST", b"/v1/x", b"e:1", headers, b"{}"),
            b"POST /v1/x HTTP/1.1\r\nHost: e:1\r\nX-A: 1\r\nX-A: 2\r\nContent-Length: 2\r\n\r\n{}",
        )
        self.assertEqual(
            serializeRequest(b"GET", b"/", b"e", Headers(), None),
            b"GET / HTTP/1.1\r\nHost: e\r\n\r\n",
        )
