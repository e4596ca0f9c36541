"""Fixtures for cluster tests: member nodes as real proxy processes and pinned test clients.

``ClusterNode`` is one member: its own certificate and cluster directory (``testing.certs``),
its own fake engine as the local backend, and a real proxy process started with
``--cluster-dir``.  ``pinnedClient`` is a TLS HTTP client presenting a chosen certificate
and accepting only one node's pin (built from a ``ClusterTrust`` over a directory of its
own, so the test side uses the same pinning rules as the proxy).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from treq.client import HTTPClient
from twisted.internet import defer
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool

from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.testing.certs import makeNodeCert, writeClusterDir, writePins
from nvpair.proxy.testing.fakeengine import FakeEngine
from tests.support.harness import ProxyFixture, startEngine

ENGINE = "llamacpp"


class LoggedProxy(ProxyFixture):
    """A ``ProxyFixture`` that can wait for a log record (the cluster watch logs each change)."""

    def __init__(
        self,
        test: TestCase,
        reactor: Any,
        argv: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(test, reactor, argv, env=env)
        self.generation = 0
        self._logWaiters: list[tuple[Callable[[dict[str, Any]], bool], defer.Deferred[Any]]] = []
        self.process._onLog = self._logged

    def _logged(self, record: dict[str, Any]) -> None:
        self.logs.append(record)
        if record.get("event") == "cluster-changed":
            self.generation = int(record["generation"])
        waiters, self._logWaiters = self._logWaiters, []
        for predicate, d in waiters:
            if predicate(record):
                d.callback(record)
            else:
                self._logWaiters.append((predicate, d))

    def waitForLog(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> defer.Deferred[Any]:
        """The next log record matching ``predicate``."""
        d: defer.Deferred[Any] = defer.Deferred()
        self._logWaiters.append((predicate, d))
        return d.addTimeout(timeout, self.reactor)

    def clusterChange(self) -> defer.Deferred[Any]:
        """Fires with the next ``cluster-changed`` record (arm it before changing files)."""
        return self.waitForLog(lambda r: r.get("event") == "cluster-changed")


class ClusterNode:
    """One cluster member: certificate, cluster directory, fake engine and proxy process."""

    def __init__(
        self,
        test: TestCase,
        reactor: Any,
        name: str,
        models: Sequence[str] = ("m1",),
        argv: Sequence[str] = (),
        engine: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.test = test
        self.reactor = reactor
        self.name = name
        self.cert, self.key, self.fp = makeNodeCert(name)
        self.dir = tempfile.mkdtemp(prefix=f"nvpair-cluster-{name}-")
        test.addCleanup(shutil.rmtree, self.dir, True)
        self.engine: FakeEngine | None = (
            startEngine(test, reactor, "openai", models, name=f"engine-{name}") if engine else None
        )
        self.proxy = LoggedProxy(test, reactor, ["--cluster-dir", self.dir, *argv], env)
        self.port = 0

    @property
    def address(self) -> str:
        """This node's facade as a peer ``host:port`` address."""
        return f"127.0.0.1:{self.port}"

    def layout(self, pins: Mapping[str, str], member: bool = True) -> None:
        """Write the cluster directory (without ``member.json`` when ``member`` is false)."""
        writeClusterDir(self.dir, self.name, self.cert, self.key, pins)
        if not member:
            os.unlink(os.path.join(self.dir, "member.json"))

    def pin(self, *nodes: ClusterNode) -> None:
        """Replace this node's pins with the given nodes' fingerprints."""
        writePins(self.dir, {n.name: n.fp for n in nodes})

    async def start(self, pins: Sequence[ClusterNode] = (), member: bool = True) -> None:
        """Lay out the directory, spawn the proxy, enable the facade, set the local backend."""
        self.layout({n.name: n.fp for n in pins}, member)
        await self.proxy.start()
        self.port = await self.proxy.enable(ENGINE)
        if self.engine is not None:
            self.proxy.notify(f"{ENGINE}:node/set-local-backend", {"url": self.engine.url})
        await self.proxy.sync()

    def peerNode(self, models: Sequence[str] | None = None) -> dict[str, Any]:
        """This node as another node's discovery sees it (a peer reached over mTLS)."""
        if models is None:
            assert self.engine is not None
            models = self.engine.models
        return {"id": self.name, "self": False, "addresses": [self.address], "models": list(models)}

    def selfNode(self) -> dict[str, Any]:
        """This node in its own discovery."""
        assert self.engine is not None
        return {"id": self.name, "self": True, "addresses": [], "models": self.engine.models}


def pinnedClient(
    test: TestCase,
    reactor: Any,
    name: str,
    cert: bytes,
    key: bytes,
    serverId: str,
    serverFP: str,
) -> HTTPClient:
    """An HTTPS client presenting ``cert`` that accepts only ``serverFP`` (non-persistent)."""
    directory = tempfile.mkdtemp(prefix=f"nvpair-client-{name}-")
    test.addCleanup(shutil.rmtree, directory, True)
    writeClusterDir(directory, name, cert, key, {serverId: serverFP})
    trust = ClusterTrust(directory, reactor, lambda message: None)
    trust.reload()
    agent = Agent(
        reactor,
        contextFactory=trust.policyForNode(serverId),
        pool=HTTPConnectionPool(reactor, persistent=False),
    )
    return HTTPClient(agent)


def chat(model: str, stream: bool = False) -> dict[str, Any]:
    """A chat completion request body."""
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def newIdentity(name: str) -> tuple[bytes, bytes, str]:
    """A fresh certificate for ``name`` (a rotation or an outsider)."""
    return makeNodeCert(name)
