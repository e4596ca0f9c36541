"""The engines and the routers of the residency benchmark.

Engines: simulated Ollama engines (``nvpair.proxy.testing.simengine --dialect ollama``),
each holding ``--max-loaded`` models, loading one in ``--load-ms``, one load at a time,
evicting the least recently used idle model, starting empty.

Routers (``ROUTERS``):

* ``least-busy``: the node with the fewest of the benchmark's requests in flight (ties in
  turn): what a load balancer does, and the proxy with ``--affinity off``;
* ``warm-first``: among the nodes whose ``/api/ps`` (read every ``PS_INTERVAL`` s) lists
  the model, the least busy; else the least busy of all (Olla's proposal);
* ``swapper``: every node a llama-swap-like swapper (one model at a time per node: its
  engines run with ``--max-loaded 1``), least busy in front;
* ``oracle``: a static assignment that bin-packs models by popularity (``binPack``): each
  request goes to the least busy node its model is assigned to (it knows the popularity
  in advance: not a router);
* ``nvpair``: the real proxy process (``--standalone``, its Ollama facade, default
  placement) in front of the engines.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Sequence
from typing import Any

import attrs
from twisted.internet import task
from twisted.internet.defer import Deferred, gatherResults
from twisted.web.client import Agent, readBody

from bench import procs

ROUTERS = ("least-busy", "warm-first", "swapper", "oracle", "nvpair")
PS_INTERVAL = 0.5


@attrs.frozen
class EngineSettings:
    """How each simulated engine runs."""

    slots: int = 2
    maxLoaded: int = 2
    loadMs: float = 3000.0
    decodeMs: float = 20.0
    prefillMs: float = 0.5
    startLoaded: tuple[str, ...] = ()  # per engine: the models it holds at start


def startEngines(n: int, models: Sequence[str], settings: EngineSettings) -> list[procs.Server]:
    """``n`` fresh simulated Ollama engines named e0, e1, ..., holding nothing, or what
    ``settings.startLoaded`` names for each (at most ``maxLoaded`` of them)."""
    servers = []
    for i in range(n):
        names = settings.startLoaded[i].split(",") if i < len(settings.startLoaded) else []
        loaded = ",".join([f"{m}:latest" for m in names if m][: settings.maxLoaded])
        argv = [
            procs.PYTHON, "-m", "nvpair.proxy.testing.simengine", "--port", "0",
            "--dialect", "ollama", "--models", ",".join(models), "--loaded", loaded,
            "--name", f"e{i}", "--slots", str(settings.slots), "--queue-max", "4096",
            "--max-loaded", str(settings.maxLoaded), "--load-ms", str(settings.loadMs),
            "--decode-ms", str(settings.decodeMs), "--prefill-ms", str(settings.prefillMs),
        ]  # fmt: skip
        proc = procs.spawn(argv, stdout=subprocess.PIPE)
        port = int(procs.readJSONLine(proc, "simulated engine", 30)["port"])
        servers.append(procs.Server(f"e{i}", port, proc.pid, [proc]))
    return servers


def engineStats(server: procs.Server) -> dict[str, Any]:
    """``GET /sim/stats`` of one engine."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/sim/stats", timeout=10) as r:
        return dict(json.loads(r.read()))


def resetEngine(server: procs.Server) -> None:
    """Zero an engine's counters (its residency stays)."""
    url = f"http://127.0.0.1:{server.port}/sim/reset"
    with urllib.request.urlopen(urllib.request.Request(url, b"{}", method="POST"), timeout=10):
        pass


class LeastBusy:
    """The node with the fewest of our requests in flight (ties in turn)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.inFlight = dict.fromkeys(self.urls, 0)
        self.turn = 0

    def pick(self, urls: Sequence[str]) -> str:
        self.turn += 1
        order = list(urls)[self.turn % len(urls) :] + list(urls)[: self.turn % len(urls)]
        url = min(order, key=lambda u: self.inFlight[u])
        self.inFlight[url] += 1
        return url

    def choose(self, model: str) -> str:
        return self.pick(self.urls)

    def ended(self, url: str, model: str) -> None:
        if url in self.inFlight:
            self.inFlight[url] -= 1


class WarmFirst(LeastBusy):
    """The least busy node that has the model loaded (its ``/api/ps``), else any."""

    def __init__(self, reactor: Any, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.agent = Agent(reactor)
        self.loaded: dict[str, set[str]] = {u: set() for u in self.urls}
        self.loop = task.LoopingCall(self.poll)
        self.loop.clock = reactor

    def start(self) -> None:
        self.loop.start(PS_INTERVAL, now=True).addErrback(lambda f: None)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def poll(self) -> Deferred[None]:
        async def one(url: str) -> None:
            try:
                response = await self.agent.request(b"GET", (url + "/api/ps").encode())
                doc = json.loads(await readBody(response))
                self.loaded[url] = {m["name"] for m in doc["models"]}
            except Exception:
                self.loaded[url] = set()

        return gatherResults([Deferred.fromCoroutine(one(u)) for u in self.urls]).addCallback(
            lambda _: None
        )

    def choose(self, model: str) -> str:
        warm = [u for u in self.urls if model in self.loaded[u]]
        return self.pick(warm or self.urls)


def binPack(popularity: Sequence[float], nodes: int, capacity: int) -> list[list[int]]:
    """Models (by index, most popular first) per node: every model gets a place while places
    last, the places left go to the most popular models by their share (at most one copy
    per node), each copy on the node with the least popularity so far; models beyond the
    places go to the least loaded node (they swap in there)."""
    places = nodes * capacity
    models = len(popularity)
    copies = [1 if m < places else 0 for m in range(models)]
    for _ in range(max(0, places - models)):
        best = max(range(models), key=lambda m: (popularity[m] / (copies[m] + 1), -m))
        if copies[best] >= nodes:
            break
        copies[best] += 1
    held: list[list[int]] = [[] for _ in range(nodes)]
    weight = [0.0] * nodes
    for m in sorted(range(models), key=lambda m: -popularity[m]):
        for _ in range(copies[m]):
            free = [n for n in range(nodes) if len(held[n]) < capacity and m not in held[n]]
            node = min(free, key=lambda n: (weight[n], n))
            held[node].append(m)
            weight[node] += popularity[m] / copies[m]
        if copies[m] == 0:
            node = min(range(nodes), key=lambda n: (weight[n], n))
            held[node].append(m)
            weight[node] += popularity[m]
    return held


class Oracle(LeastBusy):
    """Each model's requests to the least busy node it is assigned to (``binPack``)."""

    def __init__(self, urls: Sequence[str], names: Sequence[str], held: list[list[int]]) -> None:
        super().__init__(urls)
        self.assigned: dict[str, list[str]] = {name: [] for name in names}
        for url, models in zip(self.urls, held, strict=True):
            for m in models:
                self.assigned[names[m]].append(url)

    def choose(self, model: str) -> str:
        return self.pick(self.assigned[model] or self.urls)


class Proxy:
    """The real proxy: every request to its Ollama facade."""

    def __init__(self, url: str) -> None:
        self.url = url

    def choose(self, model: str) -> str:
        return self.url

    def ended(self, url: str, model: str) -> None:
        pass


def startProxy(engines: list[procs.Server]) -> tuple[procs.Server, int]:
    """The standalone proxy's Ollama facade over ``engines``: its server and ops port."""
    ops = procs.freePort()
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    server = procs.spawnStandalone(urls, opsPort=ops, engine="ollama")
    procs.waitForFleet(server, ops, len(engines), engine="ollama")
    return server, ops


def proxyResidency(ops: int) -> dict[str, Any]:
    """What the proxy saw: loads and evictions per node (``/status`` ``residency``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ops}/status", timeout=10) as r:
        status = json.loads(r.read())
    nodes = (status.get("residency") or {}).get("nodes", {})
    return {
        "loadsSeen": sum(n.get("loads", 0) for n in nodes.values()),
        "evictionsSeen": sum(n.get("evictions", 0) for n in nodes.values()),
        "parallel": [n.get("parallel") for n in nodes.values()],
        "events": sorted(
            (e["at"], node, e["event"], e["model"])
            for node, n in nodes.items()
            for e in n.get("events", [])
        ),
    }
