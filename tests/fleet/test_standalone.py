"""Standalone fleets end to end (protocol §9): the real process with no broker, fake engines."""

from __future__ import annotations

from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import FakeEngine, Status
from tests.support.harness import freePort, startEngine
from tests.support.standaloneharness import StandaloneProxy

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


async def listIds(url: str) -> list[str]:
    """The ids of a fleet model list served at ``url``."""
    response = await treq.get(url, persistent=False)
    body = await response.json()
    assert response.code == 200, response.code
    return [entry["id"] for entry in body["data"]]


class StandaloneFleetTests(TestCase):
    """A standalone facade routes over its ``--backend`` fleet as it would under a broker."""

    timeout = 90

    async def _proxy(
        self,
        backends: list[tuple[str, str]],
        engines: tuple[str, ...] = ("llamacpp",),
        extra: tuple[str, ...] = (),
    ) -> StandaloneProxy:
        proxy = StandaloneProxy(self, reactor, engines, backends, extra)
        await proxy.start()
        return proxy

    @defer.inlineCallbacks
    def test_failover(self):  # type: ignore[no-untyped-def]
        """A 503 from the first engine of the fleet fails over to the second, which serves."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m1"], name="B")
        # The order given on the command line is the order tried (not the ids' sort order):
        # give the larger URL first so the two orders differ.
        second, first = sorted((a, b), key=lambda e: e.url)
        # With --affinity off (with prefix, new conversations spread by their key instead).
        proxy = yield defer.Deferred.fromCoroutine(
            self._proxy(
                [("llamacpp", first.url), ("llamacpp", second.url)], extra=("--affinity", "off")
            )
        )
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-up" and r["url"] == a.url)
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-up" and r["url"] == b.url)
        first.script(Status(503))
        response = yield treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions", json=CHAT, persistent=False
        )
        body = yield response.json()
        self.assertEqual(response.code, 200)
        self.assertEqual(body["choices"][0]["message"]["content"], "tok0tok1tok2")
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), [second.url])
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-attempts"), ["2"])
        chats = [r for r in first.requests if r.path == "/v1/chat/completions"]
        self.assertEqual(len(chats), 1)

    @defer.inlineCallbacks
    def test_mergedListAndOwnerRouting(self):  # type: ignore[no-untyped-def]
        """The list merges both engines' models; a model only one advertises goes to that one."""
        a = startEngine(self, reactor, "openai", ["m1", "shared"], name="A")
        b = startEngine(self, reactor, "openai", ["m2", "shared"], name="B")
        proxy = yield defer.Deferred.fromCoroutine(
            self._proxy([("llamacpp", a.url), ("llamacpp", b.url)])
        )
        for engine in (a, b):
            yield proxy.waitForLog(
                lambda r, e=engine: r.get("event") == "backend-up" and r["url"] == e.url
            )
        ids = yield defer.Deferred.fromCoroutine(listIds(proxy.url("llamacpp") + "/v1/models"))
        self.assertEqual(sorted(ids), ["m1", "m2", "shared"])
        for model, engine in (("m1", a), ("m2", b)):
            response = yield treq.post(
                proxy.url("llamacpp") + "/v1/chat/completions",
                json={**CHAT, "model": model},
                persistent=False,
            )
            yield response.content()
            self.assertEqual(response.code, 200)
            self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), [engine.url])

    @defer.inlineCallbacks
    def test_engineComesUpLater(self):  # type: ignore[no-untyped-def]
        """An engine down at start has no inventory (502 no_owner); once it listens, the next
        poll (within 5 s) makes its models listed and routable."""
        port = freePort()
        url = f"http://127.0.0.1:{port}"
        proxy = yield defer.Deferred.fromCoroutine(self._proxy([("llamacpp", url)]))
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-down" and r["url"] == url)
        ids = yield defer.Deferred.fromCoroutine(listIds(proxy.url("llamacpp") + "/v1/models"))
        self.assertEqual(ids, [])
        response = yield treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions", json=CHAT, persistent=False
        )
        body = yield response.json()
        self.assertEqual(response.code, 502)
        self.assertEqual(body["error"]["code"], "no_owner")

        engine = FakeEngine(reactor, "openai", ["m1"], name="late")
        engine.listen(port)
        self.addCleanup(engine.close)
        found: list[str] = []
        for _ in range(40):  # bounded: 40 × 0.5 s, the contract says every 5 s
            found = yield defer.Deferred.fromCoroutine(
                listIds(proxy.url("llamacpp") + "/v1/models")
            )
            if found:
                break
            yield task.deferLater(reactor, 0.5, lambda: None)
        self.assertEqual(found, ["m1"])
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-up" and r["url"] == url)
        response = yield treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions", json=CHAT, persistent=False
        )
        yield response.content()
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), [url])

    @defer.inlineCallbacks
    def test_engineGoesDown(self):  # type: ignore[no-untyped-def]
        """An engine that stops answering loses its inventory at the next poll."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m2"], name="B")
        proxy = yield defer.Deferred.fromCoroutine(
            self._proxy([("llamacpp", a.url), ("llamacpp", b.url)])
        )
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-up" and r["url"] == b.url)
        yield b.close()
        yield proxy.waitForLog(
            lambda r: r.get("event") == "backend-down" and r["url"] == b.url, timeout=20
        )
        ids = yield defer.Deferred.fromCoroutine(listIds(proxy.url("llamacpp") + "/v1/models"))
        self.assertEqual(ids, ["m1"])

    @defer.inlineCallbacks
    def test_defaultsAndCleanStdout(self):  # type: ignore[no-untyped-def]
        """An engine without ``--backend`` gets its default node; stdout stays empty; SIGTERM
        exits 0."""
        a = startEngine(self, reactor, "ollama", ["llama3"], name="A")
        proxy = yield defer.Deferred.fromCoroutine(
            self._proxy([("ollama", a.url)], engines=("ollama", "llamacpp"))
        )
        for engineId in ("ollama", "llamacpp"):
            yield proxy.waitForLog(
                lambda r, e=engineId: r.get("event") == "standalone-fleet" and r["engine"] == e
            )
        fleets = {r["engine"]: r["backends"] for r in proxy.events("standalone-fleet")}
        self.assertEqual(fleets, {"ollama": [a.url], "llamacpp": ["http://127.0.0.1:8081"]})
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-up" and r["url"] == a.url)
        response = yield treq.get(proxy.url("ollama") + "/api/tags", persistent=False)
        body: Any = yield response.json()
        self.assertEqual([m["name"] for m in body["models"]], ["llama3"])
        response = yield treq.post(
            proxy.url("ollama") + "/api/chat",
            json={
                "model": "llama3",
                "stream": False,
                "messages": [{"role": "user", "content": "hi"}],
            },
            persistent=False,
        )
        body = yield response.json()
        self.assertEqual(response.code, 200)
        self.assertEqual(body["message"]["content"], "tok0tok1tok2")
        code = yield proxy.stop()
        self.assertEqual(code, 0)
        assert proxy.proto is not None
        self.assertEqual(proxy.proto.stdout, b"")
