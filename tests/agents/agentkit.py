"""The agents' integration fixture: simulated engines on loopback behind the real standalone
proxy (``twistd -n nvpair-proxy --standalone``), its operations listener, and the official
``anthropic`` and ``openai`` clients pointed at a facade.

The clients are synchronous: tests run them in the reactor's thread pool
(``deferToThread``) while the reactor serves the simulated engines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import openai
import treq
from twisted.internet import reactor as _reactor
from twisted.internet import task
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from tests.support.harness import reservedPort
from tests.support.standaloneharness import StandaloneProxy, backendUp

reactor: Any = _reactor
SECRET = "sk-agents-integration-secret"
E = TypeVar("E", bound=Exception)


async def raises(call: Callable[[], object], kind: type[E]) -> E:
    """What ``call`` (a client's, run in a thread) raised, which must be a ``kind``."""
    try:
        await deferToThread(call)
    except kind as error:
        return error
    raise AssertionError(f"{kind.__name__} was not raised")


class AgentFleet:
    """Simulated engines of one dialect behind the real standalone proxy's ``engine`` facade."""

    def __init__(self, test: TestCase, engine: str) -> None:
        self.test = test
        self.engine = engine
        self.engines: list[SimEngine] = []
        self.urls: list[str] = []
        self.opsPort = reservedPort(test)

    async def start(self, configs: list[SimConfig], *extra: str) -> None:
        """Start the engines, then the proxy with them as its fleet; wait until it has read
        every engine's model list."""
        for config in configs:
            engine = SimEngine(reactor, config)
            port = engine.listen(0)
            self.test.addCleanup(engine.close)
            self.engines.append(engine)
            self.urls.append(f"http://127.0.0.1:{port}")
        self.proxy = StandaloneProxy(
            self.test,
            reactor,
            [self.engine],
            [(self.engine, url) for url in self.urls],
            ["--ops-port", str(self.opsPort), *extra],
        )
        await self.proxy.start()
        for url in self.urls:
            await self.proxy.waitForLog(backendUp(url))

    @property
    def url(self) -> str:
        """The facade's base URL."""
        return self.proxy.url(self.engine)

    def anthropic(self, maxRetries: int = 0) -> anthropic.Anthropic:
        """The official Anthropic client on the facade (``ANTHROPIC_BASE_URL`` style: no
        ``/v1``), closed when the test ends."""
        client = anthropic.Anthropic(
            base_url=self.url, api_key=SECRET, max_retries=maxRetries, timeout=60.0
        )
        self.test.addCleanup(client.close)
        return client

    def openai(self, maxRetries: int = 0) -> openai.OpenAI:
        """The official OpenAI client on the facade (``.../v1``), closed when the test ends."""
        client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=SECRET, max_retries=maxRetries, timeout=60.0
        )
        self.test.addCleanup(client.close)
        return client

    async def ops(self, path: str) -> bytes:
        """A GET on the operations listener: the body of its 200 answer."""
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}{path}", persistent=False)
        body = bytes(await treq.content(response))
        self.test.assertEqual(response.code, 200, body[:300])
        return body

    async def status(self) -> dict[str, Any]:
        """``/status``."""
        document: dict[str, Any] = json.loads(await self.ops("/status"))
        return document

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0 when absent)."""
        text = (await self.ops("/metrics")).decode()
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in text.splitlines():
            found = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if found is None or found.group(1) != name:
                continue
            got = ",".join(sorted((found.group(2) or "").split(","))) if found.group(2) else ""
            if not labels or got == wanted:
                total += float(found.group(3))
        return total

    async def ended(self, count: int) -> dict[str, Any]:
        """``/status`` once ``count`` workloads of the facade have ended (polled, bounded):
        the end of a stream the client closed early is reported just after its answer."""
        for _ in range(250):
            status = await self.status()
            recent = [w for w in status["workloads"]["recent"] if w["engine"] == self.engine]
            if len([w for w in recent if w["completedAt"] is not None]) >= count:
                return status
            await task.deferLater(reactor, 0.02, lambda: None)
        raise AssertionError(f"fewer than {count} workloads ended: {status['workloads']}")


def sim(name: str, dialect: str = "llamacpp", **settings: Any) -> SimConfig:
    """A simulated engine serving model ``m``."""
    models = ("m:latest",) if dialect == "ollama" else ("m",)
    return SimConfig(dialect=dialect, name=name, models=models, **settings)
