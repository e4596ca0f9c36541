"""The engines and the routers of the placement benchmark, each started fresh and ended by
its pid (``bench.procs``).

Routers: ``nvpair-prefix`` / ``nvpair-off`` (``twistd -n nvpair-proxy --standalone
--affinity prefix|off``, the llama.cpp facade, one ``--backend`` per engine), ``nginx``
(round robin over the engines), ``sglang``, ``smg`` and ``vllm`` (``sglang-router launch``,
its successor ``smg launch`` and ``vllm-router`` from ``bench/.venv``, ``--policy
cache_aware``), and two client-side choosers that need no process: ``random`` (a seeded
random engine per request) and ``oracle`` (each tenant pinned to one engine, tenants
spread evenly).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from prometheus_client.parser import text_string_to_metric_families

from bench import procs

MODEL = "bench"
ROUTERS = ("nvpair-prefix", "nvpair-off", "nginx", "random", "oracle", "sglang", "vllm", "smg")
BENCH_VENV = os.path.join(procs.ROOT, "bench", ".venv", "bin")
RUST = {"sglang": ["sglang-router", "launch"], "smg": ["smg", "launch"], "vllm": ["vllm-router"]}
# A readiness request that stays short on a real engine too (llama-server's default is to
# generate until the end of the context).
READY = b'{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'


class Keyed(Protocol):
    """What a chooser reads of a request's conversation: its tenant (app)."""

    @property
    def tenant(self) -> int:
        """The tenant (app) the conversation belongs to."""
        ...


Choose = Callable[[Keyed, int], str]


@attrs.frozen
class EngineSettings:
    """How each simulated engine runs."""

    slots: int
    cacheTokens: int
    blockSize: int
    prefillMs: float
    decodeMs: float


def startEngines(n: int, settings: EngineSettings) -> list[procs.Server]:
    """``n`` fresh simulated llama.cpp engines named e0, e1, ..."""
    servers = []
    for i in range(n):
        argv = [
            procs.PYTHON,
            "-m",
            "nvpair.proxy.testing.simengine",
            "--port",
            "0",
            "--dialect",
            "llamacpp",
            "--models",
            MODEL,
            "--name",
            f"e{i}",
            "--slots",
            str(settings.slots),
            "--queue-max",
            "4096",
            "--cache-tokens",
            str(settings.cacheTokens),
            "--block-size",
            str(settings.blockSize),
            "--prefill-ms",
            str(settings.prefillMs),
            "--decode-ms",
            str(settings.decodeMs),
            "--ctx",
            "65536",
        ]
        proc = procs.spawn(argv, stdout=subprocess.PIPE)
        port = int(procs.readJSONLine(proc, "simulated engine", 30)["port"])
        servers.append(procs.Server(f"e{i}", port, proc.pid, [proc]))
    return servers


def engineStats(server: procs.Server) -> dict[str, object]:
    """``GET /sim/stats`` of one engine."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/sim/stats", timeout=10) as r:
        return dict(json.loads(r.read()))


def routerAvailable(name: str) -> str | None:
    """Why ``name`` cannot run here, or None."""
    if name == "nginx" and procs.nginxBinary() is None:
        return "nginx is not installed (bench/run.sh installs it)"
    if name in RUST:
        binary = RUST[name][0]
        if not os.path.exists(os.path.join(BENCH_VENV, binary)):
            package = "sglang-router vllm-router" if name != "smg" else "smg"
            return f"{binary} is not installed: bench/.venv/bin/pip install {package}"
    return None


def _startProxy(engines: list[procs.Server], affinity: str) -> procs.Server:
    ops = procs.freePort()
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    server = procs.spawnStandalone(urls, "--affinity", affinity, opsPort=ops)
    procs.waitForFleet(server, ops, len(engines))
    OPS_PORTS[server.port] = ops
    return server


OPS_PORTS: dict[int, int] = {}  # a started proxy's port -> its operations port


def proxyPlacement(server: procs.Server) -> dict[str, Any] | None:
    """What a started proxy says of its placements (``/status``): the affinity counts of
    its llama.cpp facade, and how holds for a prefix holder ended; None for other routers."""
    ops = OPS_PORTS.get(server.port)
    if ops is None:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{ops}/status", timeout=10) as r:
        status = json.loads(r.read())
    queueing = status.get("queueing") or {}
    with urllib.request.urlopen(f"http://127.0.0.1:{ops}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    attempts: dict[str, float] = {}  # dispatch attempts by how they ended
    for family in text_string_to_metric_families(metrics):
        if family.name == "nvpair_proxy_dispatch_attempts":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    reason = sample.labels["reason"]
                    attempts[reason] = attempts.get(reason, 0.0) + sample.value
    return {
        "placements": (status.get("affinity") or {}).get("counts", {}).get("llamacpp"),
        "held": queueing.get("held"),
        "attempts": attempts,
    }


def startRustRouter(name: str, urls: list[str]) -> procs.Server:
    """``sglang-router launch``, ``smg launch`` or ``vllm-router`` (``cache_aware``) in
    front of ``urls``, its log in ``bench/out/NAME-router.log``; returns once a chat
    completion passes."""
    port, metrics = procs.freePort(), procs.freePort()
    binary, *rest = RUST[name]
    head = [os.path.join(BENCH_VENV, binary), *rest]
    argv = [
        *head,
        "--worker-urls",
        *urls,
        "--policy",
        "cache_aware",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(metrics),
    ]
    os.makedirs(os.path.join(procs.ROOT, "bench", "out"), exist_ok=True)
    log = open(os.path.join(procs.ROOT, "bench", "out", f"{name}-router.log"), "wb")
    proc = procs.spawn(argv, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    procs.waitForPort(port, f"{name} router", proc, timeout=60)
    _waitForChat(port, timeout=60)
    return procs.Server(name, port, proc.pid, [proc])


def _waitForChat(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last, _ = procs.post(port, READY, timeout=30)
            if last == 200:
                return
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"no 200 through port {port} within {timeout:.0f}s (last: {last})")


MESSAGES_PROBE = {
    "model": MODEL,
    "max_tokens": 1,
    "messages": [{"role": "user", "content": "hi"}],
}


def servesMessages(server: procs.Server) -> str | None:
    """None when a started router answers ``POST /v1/messages`` with a 200, else what it
    answered (a router that does not serve Messages is left out of the agent workload)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/messages",
        data=json.dumps(MESSAGES_PROBE).encode(),
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
            return None
    except urllib.error.HTTPError as e:
        return f"{server.name} answered {e.code} to POST /v1/messages"
    except OSError as e:
        return f"{server.name} failed on POST /v1/messages ({e})"


def startRouter(
    name: str, engines: list[procs.Server], seed: int
) -> tuple[procs.Server | None, Choose]:
    """Start router ``name`` in front of ``engines``: its server (None for client-side
    choosers) and the function choosing each turn's base URL."""
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    if name == "random":
        rng = random.Random(seed)
        return None, lambda conv, turn: rng.choice(urls)
    if name == "oracle":
        return None, lambda conv, turn: urls[conv.tenant % len(urls)]
    server: procs.Server
    if name.startswith("nvpair-"):
        server = _startProxy(engines, name.split("-", 1)[1])
    elif name == "nginx":
        out = os.path.join(procs.ROOT, "bench", "out")
        server = procs.startNginx([e.port for e in engines], out, 4096)
    else:
        server = startRustRouter(name, urls)
    url = f"http://127.0.0.1:{server.port}"
    return server, lambda conv, turn: url
