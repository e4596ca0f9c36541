"""The request path's integration case: the real process under a scripted broker with one
facade over fake engines named A, B, ..., short timeouts (``FAST``), and ``async def`` tests."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import (
    FakeEngine,
)
from tests.support.harness import ProxyFixture, directNode, startEngine

FAST = [
    "--response-header-timeout",
    "2s",
    "--backoff-base",
    "50ms",
    "--backoff-max",
    "200ms",
    "--job-deadline",
    "3s",
    "--dial-timeout",
    "2s",
    "--client-write-timeout",
    "2s",
]
"""Short timeouts and backoffs: a failing engine is given up on within seconds."""
PLAIN = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
"""A chat request, not streamed."""


def asyncTest(f: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Any]:
    """Run an ``async def`` test method as a Deferred (trial waits on it)."""

    @functools.wraps(f)
    def run(self: Any) -> defer.Deferred[None]:
        return defer.Deferred.fromCoroutine(f(self))

    return run


class RequestCase(TestCase):
    """A proxy with one facade and fake engines named A, B, ..."""

    timeout = 60
    engineId = "llamacpp"
    dialect = "openai"
    models: tuple[str, ...] = ("m1",)

    async def setUpProxy(
        self,
        names: tuple[str, ...] = ("A", "B"),
        argv: list[str] = FAST,
    ) -> tuple[ProxyFixture, int, list[FakeEngine]]:
        engines = [
            startEngine(self, reactor, self.dialect, list(self.models), name=n) for n in names
        ]
        proxy = ProxyFixture(self, reactor, argv)
        await proxy.start()
        port = await proxy.enable(self.engineId)
        await proxy.nodes(
            self.engineId, [directNode(n, e) for n, e in zip(names, engines, strict=True)]
        )
        self.proxy, self.port, self.engines = proxy, port, engines
        return proxy, port, engines

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def post(self, path: str, doc: dict[str, Any]) -> tuple[int, Any, bytes]:
        response = await treq.post(self.url(path), json=doc, persistent=False)
        body = await treq.content(response)
        return response.code, response.headers, body

    async def terminal(self) -> tuple[str, dict[str, Any]]:
        """The first terminal workload event (waiting for it when needed)."""

        def isEnd(method: str) -> bool:
            return method in ("workload:completed", "workload:errored")

        for method, params in self.proxy.notifications:
            if isEnd(method):
                return method, params["workloadInfo"]
        await defer.race(
            [
                defer.Deferred.fromCoroutine(self.proxy.waitFor("workload:completed")),
                defer.Deferred.fromCoroutine(self.proxy.waitFor("workload:errored")),
            ]
        )
        for method, params in self.proxy.notifications:
            if isEnd(method):
                return method, params["workloadInfo"]
        raise AssertionError("no terminal event")
