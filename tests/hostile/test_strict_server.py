"""The facade's strict HTTP/1.1 rules (issue 15) against the real process.

One ``twistd -n nvpair-proxy`` with a fake llama.cpp engine; raw TCP clients send what RFC
9112 says a server must refuse or rewrite: a missing or repeated ``Host``,
``Transfer-Encoding`` in HTTP/1.0, a signed ``Content-Length``, bare-LF line endings, an
oversized head, and an absolute-form target (forwarded in origin form).
"""

from __future__ import annotations

import json

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import Answer
from tests.support.fakes.rawclient import RawClient, connect
from tests.support.harness import ProxyFixture, directNode, startEngine

BODY = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}).encode()


def statusOf(answer: bytes) -> int:
    """The status code of the first response in ``answer``."""
    return int(answer.split(b" ", 2)[1])


def errorCode(answer: bytes) -> str:
    """The ``code`` of an OpenAI-shaped error answer."""
    body = answer.partition(b"\r\n\r\n")[2]
    return str(json.loads(body)["error"]["code"])


class StrictServerTests(TestCase):
    """Refusals are answered at once, in the engine's error shape, and close."""

    timeout = 120

    async def proxy(self, *argv: str) -> tuple[ProxyFixture, int, object]:
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        engine.default = Answer(chunks=1)
        proxy = ProxyFixture(self, reactor, ["--header-read-timeout", "30s", *argv])
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes("llamacpp", [directNode("A", engine)])
        return proxy, port, engine

    async def exchange(self, port: int, raw: bytes) -> bytes:
        """Send ``raw`` on a new connection; what came back once the proxy closed it (well
        within the 30 s header timeout, or the wait fails)."""
        client = RawClient()
        await connect(port, client)
        client.transport.write(raw)  # type: ignore[union-attr]
        await client.lost.addTimeout(10, reactor)
        return client.received

    @defer.inlineCallbacks
    def test_refusals(self):  # type: ignore[no-untyped-def]
        """Missing Host, repeated Host, TE in HTTP/1.0, ``Content-Length: +5`` and bare LF
        are 400 ``bad_request`` and close; a head over ``--max-header-bytes`` is 431; none
        reaches the engine, and the process keeps serving."""
        proxy, port, engine = yield defer.Deferred.fromCoroutine(
            self.proxy("--max-header-bytes", "4096")
        )
        cases = [
            (b"GET /v1/models HTTP/1.1\r\nAccept: */*\r\n\r\n", 400),
            (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
            (
                b"POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                400,
            ),
            (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: +5\r\n\r\nhello",
                400,
            ),
            # bare LF, and the head left unfinished: the answer cannot wait for its end
            (b"GET /v1/models HTTP/1.1\nHost: 127.0.0.1\n", 400),
            (
                b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(60))
                + b"\r\n",
                431,
            ),
        ]
        for raw, status in cases:
            started = reactor.seconds()
            answer = yield defer.Deferred.fromCoroutine(self.exchange(port, raw))
            self.assertLess(reactor.seconds() - started, 10)
            self.assertEqual(statusOf(answer), status, (raw, answer))
            self.assertEqual(errorCode(answer), "bad_request", answer)
            self.assertIn(b"\r\nConnection: close\r\n", answer)
        self.assertEqual(engine.requestCount, 0)
        answer = yield defer.Deferred.fromCoroutine(
            self.exchange(
                port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
        )
        self.assertEqual(statusOf(answer), 200, answer)
        self.assertEqual(proxy.crashes, [])

    @defer.inlineCallbacks
    def test_absoluteFormForwardedInOriginForm(self):  # type: ignore[no-untyped-def]
        """``POST http://host:port/v1/chat/completions?trace=1`` reaches the engine as
        ``/v1/chat/completions?trace=1``, and the client gets the engine's answer."""
        proxy, port, engine = yield defer.Deferred.fromCoroutine(self.proxy())
        raw = (
            b"POST http://127.0.0.1:%d/v1/chat/completions?trace=1 HTTP/1.1\r\n"
            b"Host: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (port, port, len(BODY)) + BODY
        )
        answer = yield defer.Deferred.fromCoroutine(self.exchange(port, raw))
        self.assertEqual(statusOf(answer), 200, answer)
        recorded = yield engine.waitForRequest(1)
        self.assertEqual((recorded.method, recorded.path), ("POST", "/v1/chat/completions?trace=1"))
        self.assertEqual(recorded.json()["model"], "m1")
        self.assertEqual(proxy.crashes, [])

    @defer.inlineCallbacks
    def test_h2cUpgradeServedWithBody(self):  # type: ignore[no-untyped-def]
        """A POST offering ``Upgrade: h2c`` (as curl sends it) is answered in HTTP/1.1, its
        body reaches the engine whole, and the connection serves the next request."""
        proxy, port, engine = yield defer.Deferred.fromCoroutine(self.proxy())
        raw = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(BODY)
            + BODY
            + b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        answer = yield defer.Deferred.fromCoroutine(self.exchange(port, raw))
        self.assertEqual(answer.count(b"HTTP/1.1 200 OK\r\n"), 2, answer)
        self.assertNotIn(b" 101 ", answer)
        recorded = yield engine.waitForRequest(1)
        self.assertEqual(recorded.body, BODY)
        self.assertEqual(proxy.crashes, [])
