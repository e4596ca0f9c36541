"""The simulated engine holds models as the real engines do (spec §16): serial loads, idle-only
LRU eviction, keep-alive, Ollama's load requests and ``/api/ps``, llama-server's router mode,
LM Studio's v1 REST API; all on a ``MemoryReactorClock``."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.testing.simengine.cli import configFromArgs, parseLoadMs
from nvpair.proxy.testing.simengine.residency.routes import keepAliveSeconds
from tests.simengine.helpers import Answer, Harness, _complete, get, post


def generate(model: str, **extra: object) -> bytes:
    """An Ollama non-streamed generate request."""
    return post(b"/api/generate", {"model": model, "prompt": "x", "stream": False, **extra})


def residency(h: Harness) -> Any:
    """The engine's ``/sim/stats`` residency object."""
    return h.exchange(get(b"/sim/stats")).json()["residency"]


class LoadTests(SynchronousTestCase):
    """Loads are serial, per model, and reported as Ollama's ``load_duration``."""

    def test_serialLoads(self) -> None:
        """Two models wanted at once load one after the other; each request waits for its
        own, and Ollama reports that wait in nanoseconds."""
        h = Harness(
            dialect="ollama",
            models=("a:latest", "b:latest"),
            loaded=(),
            loadMs=1000.0,
            loadMsPerModel=(("b:latest", 2000.0),),
            decodeMs=0.0,
            prefillMs=0.0,
        )
        _, ta = h.send(generate("a"))
        _, tb = h.send(generate("b"))
        h.runUntil(lambda: _complete(ta.value()) and _complete(tb.value()), 10)
        self.assertEqual(h.clock.seconds(), 3.0)
        a, b = Answer(ta.value()).json(), Answer(tb.value()).json()
        self.assertEqual((a["load_duration"], b["load_duration"]), (1_000_000_000, 3_000_000_000))
        self.assertGreaterEqual(a["total_duration"], a["load_duration"])
        self.assertEqual(residency(h)["loads"], 2)
        again = h.exchange(generate("a")).json()
        self.assertEqual(again["load_duration"], 0)

    def test_evictsLeastRecentlyUsedIdle(self) -> None:
        """Past ``--max-loaded`` the least recently used idle model unloads."""
        h = Harness(dialect="ollama", models=("a:latest", "b:latest", "c:latest"),
                    loaded=("a:latest", "b:latest"), maxLoaded=2, loadMs=500.0)  # fmt: skip
        h.exchange(generate("a"))
        h.exchange(generate("c"))
        self.assertEqual(residency(h)["loaded"], ["a:latest", "c:latest"])
        self.assertEqual((residency(h)["evictions"], residency(h)["loads"]), (1, 1))

    def test_neverEvictsABusyModel(self) -> None:
        """A model with a request running is never evicted: the load waits until it is idle."""
        h = Harness(dialect="ollama", models=("a:latest", "b:latest"), loaded=("a:latest",),
                    maxLoaded=1, loadMs=100.0, decodeMs=1000.0, outputTokens=5)  # fmt: skip
        _, ta = h.send(generate("a"))
        h.clock.advance(0)  # the engine reads a request on the next turn
        h.clock.advance(0.5)
        _, tb = h.send(generate("b"))
        h.clock.advance(0)
        h.clock.advance(4.0)
        self.assertEqual(residency(h)["loaded"], ["a:latest"])
        self.assertEqual(residency(h)["waiting"], 1)
        h.runUntil(lambda: _complete(tb.value()), 10)
        self.assertTrue(_complete(ta.value()))
        self.assertEqual(residency(h)["loaded"], ["b:latest"])
        # b arrived at 0.5; a ended at 5.5 (its decode was scheduled when the 0.5 s step ran
        # its prefill); b's load then took 0.1 s: Ollama's load_duration counts the wait.
        self.assertAlmostEqual(Answer(tb.value()).json()["load_duration"] / 1e9, 5.1, places=3)

    def test_clientLeavingWhileLoading(self) -> None:
        """A client that leaves while its model loads is gone; the load still completes."""
        h = Harness(dialect="ollama", models=("a:latest",), loaded=(), loadMs=1000.0)
        connection, _ = h.send(generate("a"))
        h.clock.advance(0.2)
        connection.transport.loseConnection()  # type: ignore[union-attr]
        connection.connectionLost()
        h.clock.advance(1.0)
        self.assertEqual((residency(h)["loaded"], residency(h)["waiting"]), (["a:latest"], 0))
        self.assertEqual(h.engine.stats.cancelled, 1)


class OllamaTests(SynchronousTestCase):
    """Ollama's load and unload requests, ``keep_alive`` and ``/api/ps``."""

    def test_preloadUnloadAndPs(self) -> None:
        """A generate with no prompt loads (answered once loaded, ``done_reason: load``);
        ``/api/ps`` lists it with sizes, VRAM and expiry; ``keep_alive: 0`` unloads."""
        h = Harness(dialect="ollama", models=("a:latest", "b:latest"), loaded=(), loadMs=2000.0)
        h.clock.advance(1_700_000_000)
        _, transport = h.send(post(b"/api/generate", {"model": "a", "keep_alive": -1}))
        h.clock.advance(1.0)
        ps = h.exchange(get(b"/api/ps")).json()["models"]
        self.assertEqual([m["name"] for m in ps], ["a:latest"], "a loading model is listed")
        self.assertEqual(transport.value(), b"")
        h.runUntil(lambda: _complete(transport.value()), 5)
        loaded = Answer(transport.value()).json()
        self.assertEqual((loaded["done"], loaded["done_reason"]), (True, "load"))
        model = h.exchange(get(b"/api/ps")).json()["models"][0]
        self.assertGreater(model["size"], 0)
        self.assertEqual(model["size_vram"], model["size"])
        self.assertGreater(model["context_length"], 0)
        self.assertTrue(model["expires_at"].startswith("2033"), "keep_alive -1: far away")
        chat = h.exchange(post(b"/api/chat", {"model": "a", "messages": [], "keep_alive": 0}))
        self.assertEqual(chat.json()["done_reason"], "unload")
        self.assertEqual(h.exchange(get(b"/api/ps")).json()["models"], [])
        stats = residency(h)
        self.assertEqual((stats["loads"], stats["unloads"]), (1, 1))
        self.assertEqual(h.exchange(post(b"/api/generate", {"model": "zz"})).status, 404)
        bad = h.exchange(post(b"/api/generate", {"model": "a", "keep_alive": "soon"}))
        self.assertEqual(bad.status, 400)

    def test_slotsPerModel(self) -> None:
        """``OLLAMA_NUM_PARALLEL`` is per loaded model: with one slot, a request for one model
        never waits behind another model's, while a second request for the same model
        queues behind the first."""
        h = Harness(dialect="ollama", models=("a:latest", "b:latest"), slots=1,
                    loaded=("a:latest", "b:latest"), maxLoaded=2, decodeMs=1000.0,
                    prefillMs=0.0, outputTokens=2)  # fmt: skip
        _, ta = h.send(generate("a"))
        _, tb = h.send(generate("b"))
        _, ta2 = h.send(generate("a"))
        h.runUntil(lambda: _complete(ta.value()) and _complete(tb.value()), 10)
        self.assertEqual(h.clock.seconds(), 2.0, "a and b ran side by side")
        self.assertFalse(_complete(ta2.value()), "the second a waits for a's one slot")
        h.runUntil(lambda: _complete(ta2.value()), 10)
        self.assertEqual(h.clock.seconds(), 4.0)
        queue = h.exchange(get(b"/sim/stats")).json()["queue"]
        self.assertEqual((queue["wait_ms_total"], queue["wait_ms_max"]), (2000.0, 2000.0))

    def test_keepAlive(self) -> None:
        """A request's ``keep_alive`` is its model's from then on: idle that long, it
        expires."""
        h = Harness(dialect="ollama", models=("a:latest",), keepAlive=300.0)
        h.exchange(generate("a", keep_alive="10s"))
        h.clock.advance(11)
        self.assertEqual(residency(h)["loaded"], [])
        self.assertEqual(residency(h)["expired"], 1)
        self.assertEqual(keepAliveSeconds("5m"), 300.0)
        self.assertEqual(keepAliveSeconds(-1), None)
        self.assertEqual(keepAliveSeconds("0"), 0.0)
        bads: list[object] = ["5", True, [], "m"]
        for bad in bads:
            self.assertEqual(keepAliveSeconds(bad), "bad")


class RouterTests(SynchronousTestCase):
    """llama-server's router mode, as ``tools/server/server-models.cpp`` answers."""

    def harness(self, **extra: Any) -> Harness:
        settings: dict[str, Any] = {
            "router": True,
            "models": ("a", "b", "c"),
            "loaded": (),
            "loadMs": 1000.0,
            "maxLoaded": 2,
            "slots": 2,
        }
        return Harness(**(settings | extra))

    def statuses(self, h: Harness) -> dict[str, str]:
        return {m["id"]: m["status"]["value"] for m in h.exchange(get(b"/models")).json()["data"]}

    def test_statusesLoadUnload(self) -> None:
        """``/models`` gives every model's status; ``POST /models/load`` answers at once and
        the model goes loading, then loaded; unload; the errors the router gives."""
        h = self.harness()
        self.assertEqual(self.statuses(h), {"a": "unloaded", "b": "unloaded", "c": "unloaded"})
        self.assertEqual(
            h.exchange(post(b"/models/load", {"model": "a"})).json(), {"success": True}
        )
        self.assertEqual(self.statuses(h)["a"], "loading")
        self.assertEqual(h.exchange(post(b"/models/load", {"model": "a"})).status, 400)
        h.clock.advance(1.0)
        self.assertEqual(self.statuses(h)["a"], "loaded")
        self.assertEqual(h.exchange(post(b"/models/load", {"model": "x"})).status, 404)
        self.assertEqual(h.exchange(post(b"/models/unload", {"model": "b"})).status, 400)
        self.assertEqual(h.exchange(post(b"/models/unload", {"model": "a"})).status, 200)
        self.assertEqual(self.statuses(h)["a"], "unloaded")
        props = h.exchange(get(b"/props")).json()
        self.assertEqual((props["role"], props["max_instances"]), ("router", 2))

    def test_perModelGetsNeedAutoloadFalse(self) -> None:
        """``/slots`` needs ``?model=``; with ``autoload=false`` a model not loaded is a 400
        and stays unloaded; without it the GET loads the model, then answers its slots."""
        h = self.harness()
        missing = h.exchange(get(b"/slots"))
        self.assertEqual(missing.status, 400)
        self.assertIn("missing", missing.json()["error"]["message"])
        refused = h.exchange(get(b"/slots?model=a&autoload=false"))
        self.assertEqual((refused.status, refused.json()["error"]["message"]),
                         (400, "model is not loaded"))  # fmt: skip
        self.assertEqual(residency(h)["loads"], 0)
        self.assertEqual(h.exchange(get(b"/slots?model=zz&autoload=false")).status, 400)
        slots = h.exchange(get(b"/slots?model=a"))
        self.assertEqual(len(slots.json()), 2)
        self.assertEqual(residency(h)["loads"], 1, "a GET without autoload=false loaded it")
        metrics = h.exchange(get(b"/metrics?model=a&autoload=false"))
        self.assertIn(b"llamacpp:requests_processing 0", metrics.body)

    def test_inferenceByModel(self) -> None:
        """A request loads its model (evicting the least recently used idle one past the
        limit); an unknown or missing model is a 400; each model has its own slots."""
        h = self.harness(prefillMs=0.0, decodeMs=1.0, outputTokens=1)
        for model in ("a", "b", "c"):
            answer = h.exchange(post(b"/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "x"}]}))  # fmt: skip
            self.assertEqual(answer.status, 200)
        self.assertEqual(self.statuses(h), {"a": "unloaded", "b": "loaded", "c": "loaded"})
        self.assertEqual(residency(h)["evictions"], 1)
        unknown = h.exchange(post(b"/v1/completions", {"model": "zz", "prompt": "x"}))
        self.assertEqual(unknown.status, 400)
        self.assertEqual(h.exchange(post(b"/v1/completions", {"prompt": "x"})).status, 400)
        self.assertIsNot(h.engine.core.slotsFor("b"), h.engine.core.slotsFor("c"))

    def test_noAutoload(self) -> None:
        """``--no-models-autoload``: a request for a model not loaded is refused, unless it
        says ``autoload=true``."""
        h = self.harness(autoload=False, prefillMs=0.0, decodeMs=1.0, outputTokens=1)
        body = {"model": "a", "prompt": "x"}
        self.assertEqual(h.exchange(post(b"/v1/completions", body)).status, 400)
        self.assertEqual(h.exchange(post(b"/v1/completions?autoload=true", body)).status, 200)
        self.assertEqual(self.statuses(h)["a"], "loaded")


class LmStudioTests(SynchronousTestCase):
    """LM Studio's v1 REST API (and a server without it)."""

    def test_slotsPerModel(self) -> None:
        """LM Studio's "Max Concurrent Predictions" is set per loaded model: with one, a
        chat for one model runs beside another model's."""
        h = Harness(dialect="lmstudio", models=("a", "b"), slots=1, loaded=("a", "b"),
                    decodeMs=1000.0, prefillMs=0.0, outputTokens=2)  # fmt: skip
        chat = {"messages": [{"role": "user", "content": "x"}], "stream": False}
        _, ta = h.send(post(b"/v1/chat/completions", {"model": "a", **chat}))
        _, tb = h.send(post(b"/v1/chat/completions", {"model": "b", **chat}))
        h.runUntil(lambda: _complete(ta.value()) and _complete(tb.value()), 10)
        self.assertEqual(h.clock.seconds(), 2.0, "a and b ran side by side")

    def test_v1(self) -> None:
        """Every model listed with its loaded instances; load answers once loaded, with
        the instance id and load time; unload by instance id."""
        h = Harness(dialect="lmstudio", models=("q", "r"), loaded=("r",), loadMs=1500.0)
        models = {m["key"]: m for m in h.exchange(get(b"/api/v1/models")).json()["models"]}
        self.assertEqual(models["q"]["loaded_instances"], [])
        self.assertEqual(models["r"]["loaded_instances"][0]["id"], "r")
        loaded = h.exchange(post(b"/api/v1/models/load", {"model": "q"})).json()
        self.assertEqual((loaded["instance_id"], loaded["status"]), ("q", "loaded"))
        self.assertEqual(loaded["load_time_seconds"], 1.5)
        self.assertEqual(h.exchange(post(b"/api/v1/models/load", {"model": "z"})).status, 404)
        gone = h.exchange(post(b"/api/v1/models/unload", {"instance_id": "r"}))
        self.assertEqual(gone.json(), {"instance_id": "r"})
        self.assertEqual(
            h.exchange(post(b"/api/v1/models/unload", {"instance_id": "r"})).status, 404
        )
        states = [m["state"] for m in h.exchange(get(b"/api/v0/models")).json()["data"]]
        self.assertEqual(states, ["loaded", "not-loaded"])
        old = Harness(dialect="lmstudio", lmstudioV1=False)
        self.assertEqual(old.exchange(get(b"/api/v1/models")).status, 404)


class CommandLineTests(SynchronousTestCase):
    """The residency flags."""

    def test_flags(self) -> None:
        """``--load-ms`` per model, ``--router``, ``--no-models-autoload``,
        ``--no-lmstudio-v1``; bad values refused."""
        config, _, _ = configFromArgs(
            "--router --models a,b --load-ms 3000,b=9000 --no-models-autoload".split()
        )
        self.assertEqual((config.loadMs, config.loadMsPerModel), (3000.0, (("b", 9000.0),)))
        self.assertEqual((config.router, config.autoload), (True, False))
        self.assertFalse(
            configFromArgs("--dialect lmstudio --no-lmstudio-v1".split())[0].lmstudioV1
        )
        for bad in ("x", "-1", "=5", "a=b"):
            self.assertEqual(parseLoadMs(bad), (None, ()))
        self.assertRaises(SystemExit, configFromArgs, ["--router", "--dialect", "ollama"])
