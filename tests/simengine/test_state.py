"""The simulated engine's state, probe and control routes, and its command line."""

from __future__ import annotations

import datetime
import io
import sys

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.testing.simengine import Failure, configFromArgs, engineFromArgs
from nvpair.proxy.testing.simengine.control import parseFailure
from tests.simengine.helpers import Harness, get, post


class StateEndpointTests(SynchronousTestCase):
    """Each dialect's state endpoints, in the real servers' shapes."""

    def test_llamacppSlotsAndMetricsOff(self) -> None:
        """Without --slots/--metrics llama-server answers 501 not_supported_error."""
        h = Harness(slotsEndpoint=False, metricsEndpoint=False)
        for path in (b"/slots", b"/metrics"):
            answer = h.exchange(get(path))
            self.assertEqual(answer.status, 501)
            self.assertEqual(answer.json()["error"]["type"], "not_supported_error")

    def test_slotsShape(self) -> None:
        """/slots lists every slot with id, n_ctx and is_processing; as llama-server, an idle
        slot has no task, parameters or next-token state."""
        slots = Harness(slots=3, nCtx=2048).exchange(get(b"/slots")).json()
        self.assertEqual([s["id"] for s in slots], [0, 1, 2])
        idle = Harness(slots=1).exchange(get(b"/slots?fail_on_no_slot=1"))
        self.assertEqual(idle.status, 200)
        self.assertEqual({(s["n_ctx"], s["is_processing"]) for s in slots}, {(2048, False)})
        self.assertEqual(
            set(slots[0]), {"id", "n_ctx", "speculative", "is_processing"}, "idle slot"
        )

    def test_metricsCountEvaluatedTokens(self) -> None:
        """/metrics is Prometheus text; prompt tokens count only those evaluated."""
        h = Harness(decodeMs=1.0)
        doc = {"prompt": " ".join(["a"] * 40), "max_tokens": 2}
        h.exchange(post(b"/v1/completions", doc))
        h.exchange(post(b"/v1/completions", doc))
        answer = h.exchange(get(b"/metrics"))
        self.assertTrue(answer.headers[b"content-type"].startswith(b"text/plain"))
        text = answer.body.decode()
        self.assertIn("# TYPE llamacpp:requests_processing gauge\n", text)
        self.assertIn("llamacpp:prompt_tokens_total 48\n", text)  # 40 + (40 - 32 cached)
        self.assertIn("llamacpp:tokens_predicted_total 4\n", text)

    def test_ollamaPs(self) -> None:
        """/api/ps lists loaded models with an RFC 3339 expires_at five minutes after use; a
        model unused for longer is unloaded."""
        h = Harness(dialect="ollama", models=("a:latest", "b:latest"))
        h.clock.advance(1_700_000_000)
        h.exchange(post(b"/api/generate", {"model": "a", "prompt": "x", "stream": False}))
        models = h.exchange(get(b"/api/ps")).json()["models"]
        self.assertEqual([m["name"] for m in models], ["a:latest"])
        expires = datetime.datetime.fromisoformat(models[0]["expires_at"].replace("Z", "+00:00"))
        self.assertLessEqual(abs(expires.timestamp() - (h.clock.seconds() + 300)), 1)
        self.assertGreater(models[0]["size_vram"], 0)
        self.assertEqual(h.exchange(get(b"/slots")).status, 404)

    def test_modelLoading(self) -> None:
        """A model not loaded costs its load time once; past the limit the least recently used
        unloads; /sim/unload unloads."""
        h = Harness(
            dialect="lmstudio",
            models=("a", "b"),
            loaded=("a",),
            loadMs=500.0,
            maxLoaded=1,
            prefillMs=0.0,
            decodeMs=1.0,
            outputTokens=1,
        )

        def states() -> list[str]:
            return [m["state"] for m in h.exchange(get(b"/api/v0/models")).json()["data"]]

        self.assertEqual(states(), ["loaded", "not-loaded"])
        start = h.clock.seconds()
        h.exchange(post(b"/v1/completions", {"model": "b", "prompt": "x"}))
        self.assertLessEqual(abs(h.clock.seconds() - start - 0.501), 0.0001)
        self.assertEqual(states(), ["not-loaded", "loaded"])
        start = h.clock.seconds()
        h.exchange(post(b"/v1/completions", {"model": "b", "prompt": "x"}))
        self.assertLessEqual(abs(h.clock.seconds() - start - 0.001), 0.0001)
        self.assertEqual(h.exchange(post(b"/sim/unload", {"model": "b"})).status, 200)
        self.assertEqual(states(), ["not-loaded", "not-loaded"])
        self.assertEqual(h.exchange(post(b"/sim/unload", {"model": 1})).status, 400)

    def test_lmstudioModels(self) -> None:
        """/api/v0/models names every model with its state."""
        doc = Harness(dialect="lmstudio", models=("a", "b")).exchange(get(b"/api/v0/models")).json()
        self.assertEqual(doc["object"], "list")
        self.assertEqual(
            [(m["id"], m["state"]) for m in doc["data"]], [("a", "loaded"), ("b", "loaded")]
        )

    def test_modelLists(self) -> None:
        """Each dialect lists its models where its real server does."""
        self.assertEqual(Harness().exchange(get(b"/models")).json()["data"][0]["id"], "m")
        tags = Harness(dialect="ollama", models=("x:latest",)).exchange(get(b"/api/tags")).json()
        self.assertEqual(tags["models"][0]["name"], "x:latest")

    def test_routerProbes(self) -> None:
        """/health, SGLang's info routes and vLLM's /tokenize answer."""
        h = Harness(slots=2)
        self.assertEqual(h.exchange(get(b"/health")).json(), {"status": "ok"})
        for path in (b"/get_model_info", b"/model_info"):
            self.assertEqual(h.exchange(get(path)).json()["model_path"], "m")
        self.assertEqual(h.exchange(get(b"/server_info")).json()["max_running_requests"], 2)
        vllm = h.exchange(post(b"/tokenize", {"model": "m", "prompt": "a b c"})).json()
        self.assertEqual((vllm["count"], len(vllm["tokens"]), vllm["max_model_len"]), (3, 3, 8192))
        chat = h.exchange(post(b"/tokenize", {"messages": [{"role": "user", "content": "a"}]}))
        self.assertEqual(chat.json()["count"], 3)
        llama = h.exchange(post(b"/tokenize", {"content": "a b"})).json()
        self.assertEqual(set(llama), {"tokens"})
        self.assertEqual(h.exchange(post(b"/tokenize", {"x": 1})).status, 400)


class ControlTests(SynchronousTestCase):
    """/sim/fail, /sim/heal, /sim/flush, /sim/reset, /sim/stats."""

    def test_failAfterDelayThenHeal(self) -> None:
        """A failing engine answers the status after the delay, with Retry-After; healed, 200."""
        h = Harness(decodeMs=1.0)
        body = {"status": 503, "delay_ms": 20, "retry_after": 2}
        self.assertEqual(h.exchange(post(b"/sim/fail", body)).status, 200)
        _, transport = h.send(post(b"/v1/completions", {"prompt": "a"}))
        h.clock.advance(0.019)
        self.assertEqual(transport.value(), b"")
        h.clock.advance(0.002)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 503 "))
        self.assertIn(b"Retry-After: 2\r\n", transport.value())
        self.assertEqual(h.engine.slots.busy, 0)
        self.assertEqual(h.exchange(get(b"/sim/stats")).json()["failing"]["status"], 503)
        h.exchange(post(b"/sim/heal", {}))
        self.assertEqual(h.exchange(post(b"/v1/completions", {"prompt": "a"})).status, 200)
        stats = h.exchange(get(b"/sim/stats")).json()
        self.assertEqual((stats["failed"], stats["completed"], stats["failing"]), (1, 1, None))

    def test_failNative(self) -> None:
        """Ollama's native routes fail with its plain error string."""
        h = Harness(dialect="ollama", failure=Failure(429, 0.0))
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        answer = h.exchange(post(b"/api/chat", chat))
        self.assertEqual((answer.status, answer.json()), (429, {"error": "simulated failure"}))

    def test_badFailBodies(self) -> None:
        """A bad /sim/fail body is 400 and changes nothing."""
        h = Harness()
        for doc in ({"status": 200}, {"delay_ms": -1}, {"retry_after": "x"}, [1]):
            self.assertEqual(h.exchange(post(b"/sim/fail", doc)).status, 400)
        self.assertIsNone(h.engine.failure)
        self.assertEqual(parseFailure({}), Failure(503, 0.0, None))
        self.assertEqual(h.exchange(get(b"/sim/fail")).status, 405)
        self.assertEqual(h.exchange(post(b"/sim/nothing", {})).status, 404)

    def test_flushAndReset(self) -> None:
        """/sim/flush empties the cache; /sim/reset zeroes the counters, not the cache."""
        h = Harness(decodeMs=1.0)
        doc = {"prompt": " ".join(["a"] * 40), "max_tokens": 1}
        h.exchange(post(b"/v1/completions", doc))
        h.exchange(post(b"/sim/reset", {}))
        stats = h.exchange(get(b"/sim/stats")).json()
        self.assertEqual(
            (stats["requests"], stats["prompt_tokens"], stats["queue"]["waits"]), (0, 0, 0)
        )
        self.assertEqual(stats["cache"]["blocks"], 2)
        h.exchange(post(b"/sim/flush", {}))
        again = h.exchange(post(b"/v1/completions", doc)).json()
        self.assertEqual(again["timings"]["cache_n"], 0)


class BadInputTests(SynchronousTestCase):
    """Bad requests get a clear error in the dialect's shape and take no slot."""

    def test_errors(self) -> None:
        """Not JSON, no prompt, unknown model, too long: 400/404, nothing runs (Ollama's native
        routes take a request without a prompt as a load: ``residency``)."""
        h = Harness(dialect="ollama", models=("a:latest",), nCtx=10)
        cases = [
            (b"/v1/chat/completions", b"{", 400),
            (b"/v1/chat/completions", b'{"model":"a"}', 400),
            (b"/api/generate", b'{"model":"zz","prompt":"x"}', 404),
            (b"/api/generate", b'{"prompt":"x"}', 400),
            (b"/api/generate", b'{"model":"a","prompt":"' + b"w " * 20 + b'"}', 400),
        ]
        for path, body, status in cases:
            raw = b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)
            answer = h.exchange(raw)
            self.assertEqual(answer.status, status, body)
            self.assertIn("error", answer.json())
        self.assertEqual(h.engine.stats.promptTokens, 0)
        self.assertEqual(h.exchange(get(b"/nowhere")).status, 404)


class CommandLineTests(SynchronousTestCase):
    """The command line builds the settings; bad values exit 2."""

    def test_flags(self) -> None:
        """Every flag lands in the settings."""
        config, host, port = configFromArgs(
            "--port 9 --dialect ollama --models a,b --slots 1 --queue-max 3 --block-size 8 "
            "--cache-tokens 800 --prefill-ms 2 --decode-ms 3 --output-tokens 4 --ctx 99 "
            "--no-slots --no-metrics --fail-status 503 --fail-delay-ms 20 --name z "
            "--loaded a --load-ms 7 --max-loaded 1 --keep-alive-s 9".split()
        )
        self.assertEqual(
            (host, port, config.dialect, config.models), ("127.0.0.1", 9, "ollama", ("a", "b"))
        )
        self.assertEqual(
            (config.slots, config.queueMax, config.blockSize, config.cacheTokens), (1, 3, 8, 800)
        )
        self.assertEqual(
            (config.prefillMs, config.decodeMs, config.outputTokens, config.nCtx), (2, 3, 4, 99)
        )
        self.assertFalse(config.slotsEndpoint or config.metricsEndpoint)
        self.assertEqual(config.failure, Failure(503, 20.0, None))
        self.assertEqual(
            (config.loaded, config.loadMs, config.maxLoaded, config.keepAlive), (("a",), 7, 1, 9)
        )

    def test_badValues(self) -> None:
        """A bad value exits 2 naming it."""
        for argv in (["--slots", "0"], ["--fail-status", "200"], ["--dialect", "x"]):
            err = io.StringIO()
            self.patch(sys, "stderr", err)
            with self.assertRaises(SystemExit) as caught:
                configFromArgs(argv)
            self.assertEqual(caught.exception.code, 2)
            self.assertIn("error", err.getvalue())

    def test_engineFromArgs(self) -> None:
        """engineFromArgs listens where asked."""
        reactor = MemoryReactorClock()
        engine = engineFromArgs(reactor, ["--port", "8089", "--host", "127.0.0.1"])
        self.assertEqual(reactor.tcpServers[0][0], 8089)
        self.assertEqual(engine.url, "http://127.0.0.1:8089")
