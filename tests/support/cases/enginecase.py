"""The fake engine's integration case: an engine per test on a loopback port, a
non-persistent HTTP client, raw TCP connections to it."""

from __future__ import annotations

import json
from typing import Any

import treq
from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress, IConnector
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse

from nvpair.proxy.testing.fakeengine import (
    FakeEngine,
)

reactor: Any = _reactor


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def sleep(seconds: float) -> Deferred[None]:
    """Return a Deferred firing after ``seconds`` on the global reactor."""
    return deferLater(reactor, seconds, lambda: None)


class _Raw(Protocol):
    """A raw TCP client collecting everything it receives."""

    def __init__(self) -> None:
        self.data = b""
        self.lost: Deferred[None] = Deferred()
        self.ready: Deferred[_Raw] = Deferred()

    def connectionMade(self) -> None:
        self.ready.callback(self)

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost.callback(None)


class _RawFactory(ClientFactory):
    """Builds one _Raw protocol."""

    def __init__(self, proto: _Raw) -> None:
        self.proto = proto

    def buildProtocol(self, addr: IAddress | None) -> _Raw:
        return self.proto

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        self.proto.ready.errback(reason)


class EngineTestCase(TestCase):
    """Common fixture: an engine per test and a non-persistent HTTP client."""

    dialect = "openai"

    def setUp(self) -> None:
        self.engine = self.makeEngine(self.dialect)
        self.http = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))

    def makeEngine(self, dialect: str, models: tuple[str, ...] = ("m1", "m2")) -> FakeEngine:
        """Start an engine on an ephemeral loopback port, closed at cleanup."""
        engine = FakeEngine(reactor, dialect, models, name=f"fake-{dialect}")
        engine.listen()
        self.addCleanup(self.closeEngine, engine)
        return engine

    async def closeEngine(self, engine: FakeEngine) -> None:
        """Close an engine and give client sockets a turn to notice."""
        await engine.close()
        await sleep(0.01)

    async def raw(self, data: bytes) -> _Raw:
        """Open a raw TCP connection to the engine and send ``data``."""
        proto = _Raw()
        reactor.connectTCP("127.0.0.1", self.engine.port, _RawFactory(proto))
        await proto.ready
        self.addCleanup(lambda: proto.lost)
        self.addCleanup(lambda: proto.transport.abortConnection())  # type: ignore[union-attr]
        proto.transport.write(data)  # type: ignore[union-attr]
        return proto

    async def post(self, path: str, body: object) -> IResponse:
        """POST a JSON body to the engine."""
        return await self.http.post(self.engine.url + path, json=body)

    async def postJSON(self, path: str, body: object) -> Any:
        """POST a JSON body and return the decoded 200 answer."""
        response = await self.post(path, body)
        self.assertEqual(response.code, 200)
        return json.loads(await treq.content(response))
