"""Unit tests of what the facade refuses or rewrites (``requestreader``, ``requestrules``,
``site.refuse``): request targets, upgrades never performed, the RFC 9110/9112 rules and
llhttp's strict framing, each refusal in the engine's error shape."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.engines import LLAMACPP, OLLAMA
from nvpair.proxy.errorshape import IErrorShape
from nvpair.proxy.http import reader as requestreader
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.http.site import FacadeSite
from tests.http.httpkit import (
    GET,
    Connection,
    Door,
    OllamaDoor,
    answer,
    chunkedPost,
    errorOf,
)


class TargetTests(SynchronousTestCase):
    """Request targets: origin form routed as is, absolute form turned into origin form."""

    def test_absoluteForm(self) -> None:
        """``POST http://host/path?q`` is routed as ``/path?q`` with the target's authority
        as its Host (RFC 9112 §3.2.2); the fragment is dropped."""
        door = Door()
        conn = Connection(door)
        out = conn.send(
            b"POST http://engine.local:8080/v1/chat/completions?a=1#frag HTTP/1.1"
            b"\r\nHost: other\r\nContent-Length: 2\r\n\r\nhi"
        )
        [request] = door.requests
        self.assertEqual(
            (request.uri, request.path), (b"/v1/chat/completions?a=1", b"/v1/chat/completions")
        )
        self.assertEqual(request.requestHeaders.getRawHeaders(b"host"), [b"engine.local:8080"])
        self.assertEqual(door.bodies, [b"hi"])
        self.assertTrue(out.startswith(b"HTTP/1.1 200 "), out)

    def test_absoluteFormIpv6NoPath(self) -> None:
        """An https target with an IPv6 literal and no path is ``/``, Host ``[::1]:9``."""
        door = Door()
        Connection(door).send(b"GET HTTPS://[::1]:9 HTTP/1.1\r\nHost: x\r\n\r\n")
        [request] = door.requests
        self.assertEqual(request.uri, b"/")
        self.assertEqual(request.getHeader(b"host"), b"[::1]:9")

    def test_asteriskForOptions(self) -> None:
        """``OPTIONS *`` is served as it is."""
        door = Door()
        Connection(door).send(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n")
        self.assertEqual(door.requests[0].uri, b"*")

    def test_refusedTargets(self) -> None:
        """Targets that are neither a path nor an http(s) URI are 400: ``*`` outside
        OPTIONS, CONNECT's authority form, another scheme, user information."""
        for line in (
            b"GET * HTTP/1.1",
            b"CONNECT engine:443 HTTP/1.1",
            b"GET ftp://h/x HTTP/1.1",
            b"GET http://u:p@h/x HTTP/1.1",
            b"GET x HTTP/1.1",
        ):
            door = Door()
            conn = Connection(door)
            out = conn.send(line + b"\r\nHost: h\r\n\r\n")
            self.assertTrue(out.startswith(b"HTTP/1.1 400 "), (line, out))
            self.assertEqual(door.requests, [], line)
            self.assertTrue(conn.closed, line)


class UpgradeTests(SynchronousTestCase):
    """Upgrade requests are served as ordinary requests, bodies included."""

    def test_h2cPostKeepsBody(self) -> None:
        """A POST offering ``Upgrade: h2c`` is answered in HTTP/1.1 with its whole body,
        and the connection goes on to the next request."""
        for body in (
            b"Content-Length: 5\r\n\r\nhello",
            b"Transfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
        ):
            door = Door()
            conn = Connection(door)
            out = conn.send(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n" + body + GET
            )
            self.assertEqual(door.bodies, [b"hello", None], body)
            self.assertEqual(door.requests[1].uri, b"/v1/models?x=1")
            self.assertEqual(out.count(b"HTTP/1.1 200 OK\r\n"), 2, out)
            self.assertNotIn(b"101", out)
            self.assertFalse(conn.closed)

    def test_h2cBodyInPieces(self) -> None:
        """The body of an upgrade request may arrive in later reads."""
        door = Door()
        conn = Connection(door)
        conn.send(
            b"POST /a HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
            b"Content-Length: 6\r\n\r\nab"
        )
        conn.send(b"cd")
        self.assertEqual(door.requests, [])
        conn.send(b"ef")
        self.assertEqual(door.bodies, [b"abcdef"])

    def test_websocketGetNotUpgraded(self) -> None:
        """A GET asking for a WebSocket upgrade is an ordinary request; what follows it is
        parsed as the next request."""
        door = Door()
        conn = Connection(door)
        out = conn.send(
            b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\n\r\n" + GET
        )
        self.assertEqual([r.uri for r in door.requests], [b"/ws", b"/v1/models?x=1"])
        self.assertEqual(out.count(b"HTTP/1.1 200 OK\r\n"), 2, out)

    def test_upgradeBodyRefused(self) -> None:
        """A malformed body of an upgrade request is refused like any other, in the shape
        of the request's own path."""
        conn = Connection(OllamaDoor())
        out = conn.send(
            b"POST /api/chat HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n"
            b"Upgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n"
        )
        status, _, doc = errorOf(out)
        self.assertEqual((status, doc["reason"]), (400, "bad_request"))
        self.assertTrue(conn.closed)

    def test_manyUpgradesInOneRead(self) -> None:
        """Thousands of pipelined upgrade requests in one read are all served in order."""
        door = Door()
        conn = Connection(door)
        one = b"GET /ws?%d HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        out = conn.send(b"".join(one % i for i in range(3000)))
        self.assertEqual(out.count(b"HTTP/1.1 200 OK\r\n"), 3000)
        self.assertEqual(door.requests[-1].uri, b"/ws?2999")


class RfcRuleTests(SynchronousTestCase):
    """RFC 9110/9112 rules llhttp leaves to the server, and strict framing, each a 400."""

    def refused(self, raw: bytes, status: int = 400) -> dict[str, Any]:
        door = Door()
        conn = Connection(door)
        out = conn.send(raw)
        code, headers, doc = errorOf(out)
        self.assertEqual(code, status, (raw, out))
        self.assertEqual(door.requests, [], raw)
        self.assertEqual(headers["connection"], b"close")
        self.assertTrue(conn.closed, raw)
        error: dict[str, Any] = doc["error"]
        self.assertEqual(error["code"], "bad_request")
        return error

    def test_missingHost(self) -> None:
        """An HTTP/1.1 request without Host is 400; an HTTP/1.0 one is served."""
        error = self.refused(b"GET /v1/models HTTP/1.1\r\nX: y\r\n\r\n")
        self.assertIn("Host", error["message"])
        door = Door()
        Connection(door).send(b"GET /v1/models HTTP/1.0\r\n\r\n")
        self.assertEqual(len(door.requests), 1)

    def test_repeatedHost(self) -> None:
        """Two Host fields (any case, same value or not) are 400, in HTTP/1.0 too."""
        self.refused(b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n")
        self.refused(b"GET / HTTP/1.0\r\nHost: a\r\nHOST: b\r\n\r\n")

    def test_invalidHost(self) -> None:
        """A Host value that is not ``host[:port]`` is 400."""
        for value in (b"a b", b"a/b", b"a:b:c", b"a@b"):
            self.refused(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % value)

    def test_transferEncodingHttp10(self) -> None:
        """Transfer-Encoding in an HTTP/1.0 request is 400."""
        self.refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n")

    def test_otherCodings(self) -> None:
        """A transfer coding other than chunked is 501."""
        error = self.refused(
            chunkedPost(b"2\r\nhi\r\n0\r\n\r\n").replace(
                b"Encoding: chunked", b"Encoding: gzip, chunked"
            ),
            501,
        )
        self.assertIn("chunked", error["message"])
        self.refused(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501)

    def test_versions(self) -> None:
        """Only HTTP/1.0 and 1.1: a request line without a version (0.9) is 400, HTTP/2.0
        is 505, HTTP/1.2 is 400."""
        self.refused(b"GET /\r\n\r\n")
        self.refused(b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505)
        self.refused(b"GET / HTTP/1.2\r\nHost: h\r\n\r\n")

    def test_bareLfAnsweredAtOnce(self) -> None:
        """Bare LF anywhere in a head is 400 as soon as it arrives, before the rest of the
        head and without the header timeout passing."""
        for raw in (
            b"GET / HTTP/1.1\nHost: h\r\n",
            b"GET / HTTP/1.1\r\nHost: h\n",
            b"GET / HTTP/1.1\r\nHost: h\r\n\n",
            b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n",
            chunkedPost(b"2\nhi\r\n0\r\n\r\n"),
        ):
            door = Door()
            conn = Connection(door, timeout=5.0)
            out = conn.send(raw)
            self.assertEqual(conn.clock.seconds(), 0.0)
            self.assertTrue(out.startswith(b"HTTP/1.1 400 "), (raw, out))
            self.assertTrue(conn.closed, raw)

    def test_contentLengthDigitsOnly(self) -> None:
        """Content-Length is digits only: a sign, underscores, hex, inner spaces, a list,
        an empty value and a repeat are 400."""
        for value in (b"+256", b"2_62", b"0x10", b" 1 2", b"-1", b"5, 5", b"", b"1e3"):
            self.refused(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %s\r\n\r\n" % value)
        self.refused(
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi"
        )

    def test_bothFramings(self) -> None:
        """Content-Length together with Transfer-Encoding is 400."""
        self.refused(
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        )

    def test_framingLlhttpRefuses(self) -> None:
        """Malformed request lines, names, values and chunks are 400 (llhttp, strict)."""
        for raw in (
            b"G@T / HTTP/1.1\r\nHost: h\r\n\r\n",  # method not a token
            b"FOO / HTTP/1.1\r\nHost: h\r\n\r\n",  # a method llhttp does not know
            b"get / HTTP/1.1\r\nHost: h\r\n\r\n",  # methods are case-sensitive
            b"GET /a\x01b HTTP/1.1\r\nHost: h\r\n\r\n",  # control byte in target
            b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n",  # space in target
            b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n",  # space after the version
            b"GET / HTTP/1.1\r\nBad Name: x\r\nHost: h\r\n\r\n",  # space in a name
            b"GET / HTTP/1.1\r\nName : x\r\nHost: h\r\n\r\n",  # space before the colon
            b"GET / HTTP/1.1\r\n folded\r\nHost: h\r\n\r\n",  # whitespace first
            b"GET / HTTP/1.1\r\nHost: h\r\nA: b\r\n c\r\n\r\n",  # obsolete folding
            b"GET / HTTP/1.1\r\nNoColon\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n",  # NUL
            b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fb\r\n\r\n",  # DEL
            chunkedPost(b"zz\r\n"),  # chunk size not hex
            chunkedPost(b"2\r\nabX\r\n"),  # chunk data overruns
            chunkedPost(b"5 \r\nhello\r\n"),  # space after the size
            chunkedPost(b"fffffffffffffffffff\r\n"),  # size overflow
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # an HTTP/2 preface
        ):
            self.refused(raw)

    def test_refusalAfterAnswerInProgress(self) -> None:
        """A malformed request pipelined behind another is answered after it, in order,
        then the connection closes; nothing after it is parsed."""
        door = Door(hold=True)
        conn = Connection(door)
        out = conn.send(GET + b"GET / HTTP/1.1\r\n\r\n" + GET)
        self.assertEqual(out, b"")
        self.assertEqual(len(door.requests), 1)
        answer(door.requests[0], b"first")
        out = conn.take()
        first, _, rest = out.partition(b"first")
        self.assertTrue(first.startswith(b"HTTP/1.1 200 "), out)
        self.assertEqual(errorOf(rest)[0], 400)
        self.assertEqual(len(door.requests), 1)
        self.assertTrue(conn.closed)

    def test_errorShapeOfEngine(self) -> None:
        """A refusal on an Ollama ``/api/`` path has Ollama's shape; the OpenAI shape
        elsewhere, and where the target is not known."""
        conn = Connection(OllamaDoor())
        status, headers, doc = errorOf(conn.send(b"POST /api/chat HTTP/1.1\r\n\r\n"))
        self.assertEqual((status, doc["reason"]), (400, "bad_request"))
        self.assertEqual(headers["content-type"], b"application/json")
        conn = Connection(OllamaDoor())
        _, _, doc = errorOf(conn.send(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n"))
        self.assertEqual(doc["error"]["type"], "proxy_error")
        conn = Connection(OllamaDoor())
        _, _, doc = errorOf(conn.send(b"B@D /api/chat HTTP/1.1\r\n\r\n"))
        self.assertEqual(doc["error"]["code"], "bad_request")

    def test_errorShapeOfMessages(self) -> None:
        """A refusal on ``/v1/messages*`` has Anthropic's shape on every facade (Ollama's
        too), whatever the refusal: a malformed request, a target over the head limit, a
        parser crash (protocol §11)."""

        def broken(*args: object) -> bytes:
            raise ValueError("a bug")

        cases = [
            (b"POST /v1/messages HTTP/1.1\r\n\r\n", 400, "bad_request", "invalid_request_error"),
            (
                b"POST /v1/messages/count_tokens?" + b"q" * 5000,
                431,
                "bad_request",
                "invalid_request_error",
            ),
        ]
        for raw, status, reason, kind in cases:
            conn = Connection(OllamaDoor())
            got, _, doc = errorOf(conn.send(raw))
            self.assertEqual(got, status)
            self.assertEqual(doc["type"], "error")
            self.assertEqual(doc["error"]["type"], kind)
            self.assertTrue(doc["error"]["message"].endswith(f"({reason})"), doc)
        self.patch(requestreader, "checkHead", broken)
        got, _, doc = errorOf(
            Connection(OllamaDoor()).send(b"POST /v1/messages HTTP/1.1\r\nHost: h\r\n\r\n")
        )
        self.assertEqual((got, doc["error"]["type"]), (500, "api_error"))
        self.assertTrue(doc["error"]["message"].endswith("(internal)"), doc)

    def test_errorShapeGiven(self) -> None:
        """The site answers its refusals in the shape of the engine it is given, whatever
        the door behind it."""
        site = FacadeSite(Door(), Clock(), 10, 1.0, 100, engine=OLLAMA)
        self.assertIs(site.engine, OLLAMA)
        site = FacadeSite(OllamaDoor(), Clock(), 10, 1.0, 100, engine=LLAMACPP)
        self.assertIs(site.engine, LLAMACPP)

    def test_refusalsCounted(self) -> None:
        """Each refusal of the HTTP layer is reported with its reason, once; a request it
        serves is not."""
        conn = Connection(Door(), maxHeaderBytes=200)
        conn.send(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(conn.refusals, [])
        conn.send(b"GET /x HTTP/1.1\r\n\r\n")
        self.assertEqual(conn.refusals, ["bad_request"])
        conn = Connection(Door(), maxHeaderBytes=200)
        conn.send(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 300 + b"\r\n\r\n")
        self.assertEqual(conn.refusals, ["bad_request"])

    def test_errorShapeWithoutEngine(self) -> None:
        """A site given no engine uses the OpenAI shape: byte for byte llama.cpp's, on every
        path (the HTTP layer has its own copy, as it does not import the facade)."""
        shape = FacadeSite(OllamaDoor(), Clock(), 10, 1.0, 100).engine
        verifyObject(IErrorShape, shape)
        verifyObject(IErrorShape, LLAMACPP)
        for path in (b"/", b"/v1/chat/completions", b"/api/chat", b"/models"):
            for reason, message in (("bad_request", 'a "quoted" text'), ("internal", "é")):
                self.assertEqual(
                    shape.errorBody(path, reason, message),
                    LLAMACPP.errorBody(path, reason, message),
                )

    def test_headRefusalHasBody(self) -> None:
        """A refused HEAD request still gets its error body (the method is not trusted)."""
        status, _, doc = errorOf(Connection(Door()).send(b"HEAD / HTTP/1.1\r\n\r\n"))
        self.assertEqual((status, doc["error"]["code"]), (400, "bad_request"))

    def test_parseCrashIs500(self) -> None:
        """An unexpected exception inside the parser's callbacks is answered 500
        ``internal`` (not passed off as the client's fault), and the connection closes."""

        def broken(*args: object) -> bytes:
            raise ValueError("a bug")

        self.patch(requestreader, "checkHead", broken)
        door = Door()
        conn = Connection(door)
        status, _, doc = errorOf(conn.send(GET))
        self.assertEqual((status, doc["error"]["code"]), (500, "internal"))
        self.assertEqual(door.requests, [])
        self.assertTrue(conn.closed)

    def test_doorCrashReported(self) -> None:
        """An exception from the door goes to its ``crashed`` with the request."""
        door = Door()

        def crash(request: IServerRequest) -> None:
            raise ZeroDivisionError("a bug")

        self.patch(door, "handle", crash)
        Connection(door).send(GET)
        self.assertEqual([type(e) for e in door.crashes], [ZeroDivisionError])
