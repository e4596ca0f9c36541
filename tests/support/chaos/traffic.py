"""The soak's traffic: deterministic requests with the canary, bounded concurrency, answers kept."""

from __future__ import annotations

import json
import random
from typing import Any

import treq
from twisted.internet import defer
from twisted.web.http_headers import Headers

from tests.support.chaos.checks import proxyPid, rssKiB
from tests.support.chaos.records import ChaosConfig, Sent
from tests.support.harness import CANARY, ProxyFixture


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


class SoakTraffic:
    """The client side of a soak: draw, send and record every request (a mixin of ``Soak``)."""

    config: ChaosConfig
    reactor: Any
    sent: list[Sent]
    port: int
    proxy: ProxyFixture | None
    rssHalf: int | None

    def log(self, text: str) -> None:
        """Progress output when the config asks for it."""
        if self.config.progress is not None:
            self.config.progress(text)

    def draw(self, index: int) -> Sent:
        """The request number ``index`` (deterministic in the seed)."""
        rng = random.Random(f"{self.config.seed}:req:{index}")
        chaosId = f"c{index}"
        model = f"m{rng.randrange(self.config.models)}"
        roll = rng.random()
        now = self.reactor.seconds()
        if roll < 0.30:
            return Sent(chaosId, "inference", "POST", "/api/chat", model, True, now)
        if roll < 0.42:
            return Sent(chaosId, "inference", "POST", "/api/chat", model, False, now)
        if roll < 0.56:
            return Sent(
                chaosId, "inference", "POST", "/api/generate", model, rng.random() < 0.5, now
            )
        if roll < 0.80:
            return Sent(
                chaosId, "inference", "POST", "/v1/chat/completions", model, rng.random() < 0.5, now
            )
        if roll < 0.90:
            return Sent(chaosId, "verbatim", "POST", "/api/pull", model, False, now)
        if roll < 0.96:
            return Sent(chaosId, "verbatim", "GET", "/api/version", None, False, now)
        return Sent(chaosId, "list", "GET", "/api/tags", None, False, now)

    def payload(self, s: Sent, rng: random.Random) -> tuple[Headers, bytes | None]:
        """Headers and body of a request (the canary in prompt and credentials)."""
        headers = Headers({"X-Chaos-Id": [s.chaosId]})
        if rng.random() < 0.5:
            headers.setRawHeaders("Authorization", [f"Bearer {CANARY}"])
        if s.method == "GET":
            return headers, None
        headers.setRawHeaders("Content-Type", ["application/json"])
        if s.kind == "verbatim":
            doc: dict[str, Any] = {"model": s.model, "insecure": False}
        elif s.path == "/api/generate":
            doc = {"model": s.model, "prompt": f"say {CANARY}", "stream": s.stream}
        else:
            doc = {
                "model": s.model,
                "stream": s.stream,
                "messages": [{"role": "user", "content": f"hello {CANARY}"}],
            }
        return headers, json.dumps(doc).encode()

    async def one(self, index: int) -> None:
        """Send request ``index`` and record what came back."""
        s = self.draw(index)
        self.sent.append(s)
        headers, body = self.payload(s, random.Random(f"{self.config.seed}:pay:{index}"))
        url = f"http://127.0.0.1:{self.port}{s.path}"
        try:
            d = treq.request(s.method, url, headers=headers, data=body, persistent=False)
            d.addTimeout(self.config.clientTimeout, self.reactor)
            response = await d
            s.status = response.code
            s.node = _header(response, b"x-nvpair-node")
            attempts = _header(response, b"x-nvpair-attempts")
            s.attempts = int(attempts) if attempts is not None else None
            s.retryAfter = _header(response, b"retry-after")
            content = treq.content(response)
            content.addTimeout(self.config.clientTimeout, self.reactor)
            try:
                s.body = await content
            except defer.TimeoutError:
                s.error = "body timed out"
            except Exception:
                s.truncated = True
        except Exception as e:
            s.error = f"{type(e).__name__}: {e}"[:200]
        s.end = self.reactor.seconds()

    async def traffic(self) -> None:
        """Drive every request with bounded concurrency; sample RSS halfway."""
        assert self.proxy is not None
        total = self.config.requests
        counter = iter(range(total))
        half = total // 2
        pid = proxyPid(self.proxy)

        async def worker() -> None:
            for index in counter:
                if index == half:
                    self.rssHalf = rssKiB(pid)
                if index and index % 1000 == 0:
                    self.log(f"  {index}/{total} requests sent")
                await self.one(index)

        workers = [defer.Deferred.fromCoroutine(worker()) for _ in range(self.config.concurrency)]
        await defer.gatherResults(workers, consumeErrors=True)
