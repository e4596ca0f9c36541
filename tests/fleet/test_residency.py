"""Model residency end to end (spec §11, "Model residency"): the real standalone process over
simulated engines on loopback, and over the real ``llama-server`` in router mode where the
checkout has one; preloads through the engines' own APIs, loads and evictions seen on
``/status`` and ``/metrics``, probes that never load a model."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import treq
from twisted.internet import defer, task
from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from tests.support.harness import reservedPort
from tests.support.llamaserver import startLlamaRouter
from tests.support.standaloneharness import StandaloneProxy, backendUp

reactor: Any = _reactor
DEADLINE = 60.0


class ResidencyCase(TestCase):
    """The real proxy (with a fleet file when given) and a way to poll its /status."""

    timeout = 300

    def sim(self, **config: Any) -> SimEngine:
        engine = SimEngine(reactor, SimConfig(**config))
        engine.listen(0)
        self.addCleanup(engine.close)
        return engine

    async def proxy(self, engine: str, backends: list[tuple[str, str]], fleet: str = "") -> None:
        self.opsPort = reservedPort(self)
        path = None
        if fleet:
            handle, path = tempfile.mkstemp(suffix=".toml")
            os.write(handle, fleet.encode())
            os.close(handle)
            self.addCleanup(os.unlink, path)
        self.running = StandaloneProxy(
            self, reactor, [engine], [] if fleet else backends,
            ["--ops-port", str(self.opsPort)], fleet=path,
        )  # fmt: skip
        await self.running.start()
        for _, url in backends:
            await self.running.waitForLog(backendUp(url), DEADLINE)

    async def ops(self, path: str) -> bytes:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}{path}", persistent=False)
        self.assertEqual(response.code, 200)
        return bytes(await response.content())

    async def until(self, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Poll /status every 0.1 s until ``check`` holds (bounded by ``DEADLINE``)."""
        deadline = reactor.seconds() + DEADLINE
        status: dict[str, Any] = {}
        while reactor.seconds() < deadline:
            status = await treq.json_content(
                await treq.get(f"http://127.0.0.1:{self.opsPort}/status", persistent=False)
            )
            if check(status):
                return status
            await task.deferLater(reactor, 0.1, lambda: None)
        self.fail(f"/status never matched: {status.get('residency')}")


def node(status: dict[str, Any], url: str) -> dict[str, Any]:
    """``/status``'s residency of one node (empty when none)."""
    entry: dict[str, Any] = status.get("residency", {}).get("nodes", {}).get(url, {})
    return entry


def held(status: dict[str, Any], url: str) -> dict[str, str]:
    """Model -> state of what one node holds, as ``/status`` says."""
    return {m["model"]: m["state"] for m in node(status, url).get("models", [])}


def holding(url: str, wanted: dict[str, str]) -> Callable[[dict[str, Any]], bool]:
    """A /status check: ``url`` holds exactly ``wanted``."""
    return lambda status: held(status, url) == wanted


class SimulatedTests(ResidencyCase):
    """Over simulated engines that hold models as the real ones do."""

    async def test_ollamaPreloadLoadsAndEvictions(self) -> None:
        """A backend's ``preload`` is loaded through Ollama's own API at start (the other
        backend gets nothing); loads and evictions the engine makes are seen on /status and
        /metrics."""
        first = self.sim(dialect="ollama", models=("a:latest", "b:latest"), loaded=(),
                         loadMs=300.0, maxLoaded=1, decodeMs=1.0, name="one")  # fmt: skip
        second = self.sim(dialect="ollama", models=("a:latest", "b:latest"), loaded=(),
                          name="two")  # fmt: skip
        fleet = (
            f'[[backend]]\nengine = "ollama"\nurl = "{first.url}"\npreload = ["b:latest"]\n'
            f'[[backend]]\nengine = "ollama"\nurl = "{second.url}"\nunload_idle = true\n'
        )
        await self.proxy("ollama", [("ollama", first.url), ("ollama", second.url)], fleet)
        status = await self.until(lambda s: held(s, first.url) == {"b:latest": "loaded"})
        self.assertEqual(first.core.residency.stats.loads, 1)
        self.assertEqual(second.core.residency.stats.loads, 0)
        actions = status["residency"]["actions"]
        self.assertEqual(actions["preload"], {first.url: ["b:latest"]})
        self.assertEqual(actions["unloadIdle"], [second.url])
        # A client reaching the engine directly loads a (b goes), then b again (a goes).
        for model in ("a", "b"):
            direct = {"model": model, "prompt": "x", "stream": False}
            answer = await treq.post(first.url + "/api/generate", json=direct, persistent=False)
            self.assertEqual(answer.code, 200)
            await answer.content()
            await self.until(holding(first.url, {f"{model}:latest": "loaded"}))
        self.assertEqual(first.core.residency.stats.evictions, 2)
        seen = node(await self.until(lambda s: node(s, first.url).get("evictions") == 2), first.url)
        self.assertEqual(seen["loads"], 3)
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn(f'nvpair_proxy_model_evictions_total{{node="{first.url}"}} 2.0', metrics)
        self.assertIn(f'nvpair_proxy_model_loaded{{model="b:latest",node="{first.url}"}} 1.0',
                      metrics)  # fmt: skip

    async def test_routerProbesNeverLoad(self) -> None:
        """A simulated llama-server router: the proxy reads its statuses and its loaded
        model's slots (``autoload=false``) and never loads a model by probing; a preload
        goes through ``POST /models/load``."""
        router = self.sim(router=True, models=("x", "y", "z"), loaded=("x",), loadMs=200.0,
                          maxLoaded=3, slots=3)  # fmt: skip
        fleet = f'[[backend]]\nengine = "llamacpp"\nurl = "{router.url}"\npreload = ["y"]\n'
        await self.proxy("llamacpp", [("llamacpp", router.url)], fleet)
        status = await self.until(lambda s: held(s, router.url) == {"x": "loaded", "y": "loaded"})
        state = status["engineStates"][router.url]
        self.assertEqual((state["probe"], state["slotsTotal"]), ("/models (router)", 6))
        before = router.core.residency.stats.loads
        self.assertEqual(before, 1, "the preload")
        await self.until(lambda s: s["engineStates"][router.url]["ageSeconds"] > 1.5)
        await self.until(lambda s: s["engineStates"][router.url]["ageSeconds"] < 0.5)
        self.assertEqual(router.core.residency.stats.loads, before, "probes loaded nothing")
        self.assertEqual(router.core.residency.status("z"), "unloaded")


class RealRouterTests(ResidencyCase):
    """The real ``llama-server`` in router mode (two names for the kit's GGUF)."""

    async def test_realRouter(self) -> None:
        """The proxy reads the router's statuses and the loaded model's own slots without
        ever loading a model; a preload goes through the router's API; /status shows it; a
        request for a model loaded nowhere is placed there and loads it."""
        server = await startLlamaRouter(
            self, reactor, ("alpha", "beta"), "--models-max", "2", "-np", "2", "-c", "2048"
        )
        fleet = f'[[backend]]\nengine = "llamacpp"\nurl = "{server.url}"\npreload = ["alpha"]\n'
        await self.proxy("llamacpp", [("llamacpp", server.url)], fleet)
        status = await self.until(
            lambda s: (
                held(s, server.url) == {"alpha": "loaded"}
                and s.get("engineStates", {}).get(server.url, {}).get("slotsTotal") == 2
            )
        )
        state = status["engineStates"][server.url]
        self.assertEqual((state["probe"], state["slotsBusy"]), ("/models (router)", 0))
        for _ in range(2):  # some more probes of the router and of alpha's slots
            await self.until(lambda s: s["engineStates"][server.url]["ageSeconds"] > 1.5)
            await self.until(lambda s: s["engineStates"][server.url]["ageSeconds"] < 0.5)
        listed = await treq.json_content(await treq.get(server.url + "/models", persistent=False))
        states = {m["id"]: m["status"]["value"] for m in listed["data"]}
        self.assertEqual(states, {"alpha": "loaded", "beta": "unloaded"})
        self.assertFalse(server.ended.called, server.lastLines())
        # Placement reads the statuses: beta, loaded nowhere, is loaded there by one request.
        chat = {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        url = self.running.url("llamacpp") + "/v1/chat/completions"
        answer = await treq.post(url, json=chat, persistent=False, timeout=DEADLINE)
        self.assertEqual(answer.code, 200, await answer.text())
        await self.until(holding(server.url, {"alpha": "loaded", "beta": "loaded"}))


class LoadPlacementTests(ResidencyCase):
    """Placement that counts loads (spec §11), through the real process over simulated
    Ollama engines holding models as the real one does."""

    def ollama(self, name: str, **config: Any) -> SimEngine:
        """A simulated Ollama engine with models ``a`` and ``b`` installed."""
        return self.sim(dialect="ollama", models=("a:latest", "b:latest"), name=name, **config)

    async def ask(self, model: str) -> int:
        """One non-streamed chat for ``model`` through the proxy: its status."""
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
        url = self.running.url("ollama") + "/api/chat"
        answer = await treq.post(url, json=body, persistent=False)
        await answer.content()
        return int(answer.code)

    async def listed(self, engines: list[SimEngine]) -> None:
        """Wait until the proxy has a fresh listing of every engine's models."""
        await self.until(lambda s: all(node(s, e.url).get("fresh") for e in engines))

    async def test_burstForAColdModelLoadsOnce(self) -> None:
        """Twenty requests arriving together for a model loaded nowhere: one load on one
        node, all twenty served."""
        engines = [self.ollama(f"e{i}", loaded=(), loadMs=1000.0, maxLoaded=2) for i in range(3)]
        await self.proxy("ollama", [("ollama", e.url) for e in engines])
        await self.listed(engines)
        codes = await defer.gatherResults([defer.ensureDeferred(self.ask("a")) for _ in range(20)])
        self.assertEqual(codes, [200] * 20)
        self.assertEqual([e.core.residency.stats.loads for e in engines].count(1), 1)
        self.assertEqual(sum(e.core.residency.stats.loads for e in engines), 1)

    async def test_warmBusyNodeServes(self) -> None:
        """A model warm on a busy node (one slot) and cold on an idle one whose only model
        was used: the warm node serves every request while its wait is shorter than a load;
        nothing is loaded or evicted on the idle node."""
        warm = self.ollama("warm", loaded=("a:latest",), slots=1, decodeMs=10.0)
        idle = self.ollama("idle", loaded=("b:latest",), maxLoaded=1, loadMs=5000.0)
        fleet = (
            f'[[backend]]\nengine = "ollama"\nurl = "{warm.url}"\nmax_concurrency = 1\n'
            f'[[backend]]\nengine = "ollama"\nurl = "{idle.url}"\n'
        )
        await self.proxy("ollama", [("ollama", warm.url), ("ollama", idle.url)], fleet)
        await self.listed([warm, idle])
        self.assertEqual(await self.ask("b"), 200)
        for _ in range(2):  # its service time is known
            self.assertEqual(await self.ask("a"), 200)
        codes = await defer.gatherResults([defer.ensureDeferred(self.ask("a")) for _ in range(6)])
        self.assertEqual(codes, [200] * 6)
        self.assertEqual(warm.core.stats.completed, 8)
        stats = idle.core.residency.stats
        self.assertEqual((stats.loads, stats.evictions), (0, 0))

    async def test_sustainedDemandOneMoreCopy(self) -> None:
        """Demand above one node's capacity (5 requests a second for 4 a second), sustained
        for longer than a load: exactly one more copy, on one of the two cold nodes."""
        engines = [
            self.ollama(f"e{i}", loaded=(), slots=2, decodeMs=30.0, loadMs=1000.0, maxLoaded=2)
            for i in range(3)
        ]
        fleet = "".join(
            f'[[backend]]\nengine = "ollama"\nurl = "{e.url}"\nmax_concurrency = 2\n'
            + ('preload = ["a:latest"]\n' if e is engines[0] else "")
            for e in engines
        )
        await self.proxy("ollama", [("ollama", e.url) for e in engines], fleet)
        await self.until(holding(engines[0].url, {"a:latest": "loaded"}))
        await self.listed(engines)
        asked = [
            task.deferLater(reactor, i * 0.2, lambda: defer.ensureDeferred(self.ask("a")))
            for i in range(75)
        ]
        codes = await defer.gatherResults(asked)
        self.assertEqual(codes, [200] * 75)
        loads = [e.core.residency.stats.loads for e in engines]
        self.assertEqual(loads[0], 1, "the preload")
        self.assertEqual(sorted(loads[1:]), [0, 1], "exactly one more copy")
