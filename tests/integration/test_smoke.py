"""A first end-to-end check: the real process behind a scripted broker serves a request."""

from __future__ import annotations

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from tests.support.harness import ProxyFixture, directNode, startEngine


class SmokeTests(TestCase):
    """The proxy enables a facade and routes an inference request to the owner."""

    timeout = 60

    @defer.inlineCallbacks
    def test_routesToOwner(self):  # type: ignore[no-untyped-def]
        """A chat completion reaches the fake engine that advertises the model."""
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        proxy = ProxyFixture(self, reactor)
        yield proxy.start()
        port = yield defer.Deferred.fromCoroutine(proxy.enable("llamacpp"))
        yield proxy.nodes("llamacpp", [directNode("A", engine)])
        response = yield treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
            persistent=False,
        )
        body = yield response.json()
        self.assertEqual(response.code, 200)
        self.assertEqual(body["choices"][0]["message"]["content"], "tok0tok1tok2")
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), ["A"])
        done = yield defer.Deferred.fromCoroutine(proxy.waitFor("workload:completed"))
        self.assertEqual(done["workloadInfo"]["scheduledOn"], "A")
        self.assertEqual(done["workloadInfo"]["stats"]["completionTokens"], 3)
