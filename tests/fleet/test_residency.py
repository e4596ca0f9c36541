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
from twisted.internet import reactor as _reactor
from twisted.internet import task
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from tests.support.harness import freePort
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
        self.opsPort = freePort()
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
        ever loading a model; a preload goes through the router's API; /status shows it."""
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
