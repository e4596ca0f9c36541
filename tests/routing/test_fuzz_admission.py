"""Fuzzing admission (issue 8): arbitrary methods, paths, headers and bodies at a facade site.

A real ``ProxyService`` on a memory reactor serves each engine's ``FacadeSite`` over a
``StringTransport``.  Whatever the request, the answer (if any yet) is a well-formed HTTP
response with a status from the allowed set, a generated error has the engine's shape and a
documented reason, nothing is ever 500, no exception is logged, and once the client leaves
the process holds no request, reservation or in-flight count.
"""

from __future__ import annotations

import json
import tempfile

import httptools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES, anthropicType, isMessagesPath
from nvpair.proxy.facade.frontdoor import FrontDoor
from nvpair.proxy.http.site import FacadeSite
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.fakecontext import ListSink
from nvpair.proxy.testing.wire import siteExchange
from tests.facade.facadekit import BusyReactor
from tests.support.harness import CANARY

MAX_BODY = 2000
MAX_HEADER_BYTES = 2048
# 200/204: fleet lists and the like; 400 malformed; 413/431 limits; 502 no owner/responder;
# 501/505 a transfer coding or HTTP version the facade does not serve.
ALLOWED = {200, 204, 400, 403, 413, 431, 501, 502, 505}
REASONS = {
    "no_owner",
    "upstream_unreachable",
    "no_content",
    "deadline_exceeded",
    "owner_unavailable",
    "attempts_exhausted",
    "bad_request",
    "body_too_large",
}

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ROUTES = sorted(
    {r.decode() for e in ENGINES.values() for r in e.inferenceRoutes | e.modelRoutes}
    | {r.decode() for e in ENGINES.values() for r in e.listRoutes}
    | {"/api/pull", "/api/version", "/", "/api/show", "/v1/models?x=1"}
)
TCHAR = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~"
token = st.text(alphabet=TCHAR, min_size=1, max_size=12)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD", "PATCH"]) | token
paths = st.sampled_from(ROUTES) | st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40
).map(lambda p: "/" + p)
headerValues = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
headers = st.lists(st.tuples(token, headerValues), max_size=6) | st.just(
    [("Origin", "http://x"), ("Access-Control-Request-Method", "POST")]
)
jsonBodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["m1", "m1:latest", "nobody", "", CANARY])
        | st.integers()
        | st.none()
    },
    optional={
        "stream": st.booleans(),
        "prompt": st.text(max_size=30),
        "messages": st.lists(st.fixed_dictionaries({"content": st.just(CANARY)})),
    },
).map(lambda d: json.dumps(d).encode())
bodies = (
    st.binary(max_size=300) | jsonBodies | st.binary(min_size=MAX_BODY + 1, max_size=MAX_BODY + 50)
)


def parseResponses(raw: bytes, head: bool = False) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Split raw bytes into well-formed HTTP/1.1 responses; fails on anything else.

    The answer to a ``HEAD`` request has its headers (Content-Length included) but no body.
    """
    out = []
    while raw:
        block, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head {raw[:200]!r}"
        lines = block.split(b"\r\n")
        version, code, _ = (lines[0].split(b" ", 2) + [b""])[:3]
        assert version == b"HTTP/1.1", lines[0]
        hdrs: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            assert colon, line
            hdrs[name.strip().lower()] = value.strip()
        if head:
            body, raw = b"", rest
        elif b"content-length" in hdrs:
            n = int(hdrs[b"content-length"])
            body, raw = rest[:n], rest[n:]
            assert len(body) == n, "short body"
        elif hdrs.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                body += rest[:n]
                rest = rest[n + 2 :]
                if n == 0:
                    break
            raw = rest
        else:
            body, raw = rest, b""
        out.append((int(code), hdrs, body))
    return out


def knownMethod(method: str) -> bool:
    """Whether llhttp accepts ``method`` (if not, the request is refused before its target
    is read, so the refusal has the shape of an unknown path)."""
    parser = httptools.HttpRequestParser(object())
    try:
        parser.feed_data(method.encode() + b" / HTTP/1.1\r\n\r\n")
    except httptools.HttpParserInvalidMethodError:
        return False
    return True


class AdmissionFuzzTests(SynchronousTestCase):
    """Each engine's facade site, admission onwards, on a memory reactor."""

    def setUp(self) -> None:
        options = Options({})
        options.parseOptions(
            ["--state-dir", tempfile.mkdtemp(prefix="nvpair-fuzz-"), "--max-body", str(MAX_BODY)]
        )
        assert options.settings is not None
        self.reactor = BusyReactor()
        self.service = ProxyService(options.settings, self.reactor)
        self.sink = ListSink()
        self.service.sinks.target = self.sink
        self.sites: dict[str, FacadeSite] = {}
        for i, engineId in enumerate(ENGINES):
            self.service.handlers.handle(
                None, "facade/enable", {"engine": engineId, "port": 6000 + i}
            )
            # one owner of m1 that never answers (the memory reactor never connects)
            self.service.handlers.handle(
                engineId,
                "discovery:nodes",
                {"nodes": [{"id": "A", "addresses": ["http://127.0.0.1:9"], "models": ["m1"]}]},
            )
            facade = self.service.facades[engineId]
            self.sites[engineId] = FacadeSite(
                FrontDoor(self.service.context, facade, self.service.fleet, self.service.hosts),
                self.reactor,
                MAX_BODY,
                30.0,
                MAX_HEADER_BYTES,
                facade.engine,
            )

    def exchange(self, engineId: str, raw: bytes) -> bytes:
        return siteExchange(self.sites[engineId], raw)

    def check(self, engineId: str, path: str, answer: bytes, head: bool = False) -> None:
        engine = ENGINES[engineId]
        for status, hdrs, body in parseResponses(answer, head):
            self.assertIn(status, ALLOWED, (status, body[:200]))
            self.assertNotIn(b"Traceback", body)
            self.assertNotIn(CANARY.encode(), body)
            if status >= 400 and body:
                doc = json.loads(body)
                if isMessagesPath(path.encode().partition(b"?")[0]):
                    self.assertEqual(doc["type"], "error", doc)
                    message = doc["error"]["message"]
                    reason = message[message.rindex("(") + 1 : -1]
                    self.assertEqual(doc["error"]["type"], anthropicType(reason), doc)
                elif engine.usesNativeErrors(path.encode()):
                    self.assertEqual(set(doc), {"error", "reason"}, doc)
                    reason = doc["reason"]
                else:
                    self.assertEqual(doc["error"]["type"], "proxy_error", doc)
                    reason = doc["error"]["code"]
                self.assertIn(reason, REASONS)
                self.assertFalse(any(h.startswith(b"access-control-") for h in hdrs), hdrs)
        self.assertQuiet()

    def assertQuiet(self) -> None:
        """Nothing crashed, nothing is held once the client has gone."""
        internal = [p for m, p in self.sink.sent if m == "errors:report"]
        self.assertEqual(internal, [])
        self.assertEqual(self.service.context.exchanges, set())
        self.assertEqual(self.service.context.reservations.byNode(), {})
        self.assertEqual(self.service.context.activity.inFlight, {})
        self.assertEqual(self.service.context.reporter.live, 0)

    @FUZZ
    @given(st.sampled_from(sorted(ENGINES)), methods, paths, headers, bodies, st.booleans())
    def test_arbitraryRequests(
        self,
        engineId: str,
        method: str,
        path: str,
        extra: list[tuple[str, str]],
        body: bytes,
        chunked: bool,
    ) -> None:
        """Any method, path, headers and body: an allowed, well-formed answer, no 500."""
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {CANARY}"]
        lines += [
            f"{k}: {v}"
            for k, v in extra
            if k.lower()
            not in ("content-length", "transfer-encoding", "host", "connection", "expect")
        ]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
            payload = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        else:
            lines.append(f"Content-Length: {len(body)}")
            payload = body
        raw = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + payload
        shapePath = path.split("?")[0] if knownMethod(method) else "/"
        self.check(engineId, shapePath, self.exchange(engineId, raw), method == "HEAD")

    @FUZZ
    @given(st.sampled_from(sorted(ENGINES)), st.binary(max_size=600))
    def test_arbitraryBytes(self, engineId: str, raw: bytes) -> None:
        """Arbitrary bytes on a connection: no answer, or an allowed well-formed one."""
        answer = self.exchange(engineId, raw)
        for status, _, body in parseResponses(answer, raw.startswith(b"HEAD ")):
            self.assertIn(status, ALLOWED, (status, body[:200]))
        self.assertQuiet()

    @FUZZ
    @given(st.sampled_from(sorted(ENGINES)), st.integers(min_value=1, max_value=400))
    def test_oversizedHeaders(self, engineId: str, count: int) -> None:
        """A header block over ``--max-header-bytes`` gets 431, never a crash."""
        raw = (
            b"GET /api/version HTTP/1.1\r\nHost: x\r\n"
            + b"X-Pad: "
            + b"p" * 40
            + b"\r\n" * 1
            + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 30) for i in range(count))
            + b"\r\n"
        )
        answer = self.exchange(engineId, raw)
        responses = parseResponses(answer)
        if len(raw) > MAX_HEADER_BYTES + 200:
            self.assertEqual([r[0] for r in responses], [431])
        self.assertQuiet()
