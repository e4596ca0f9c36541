"""The clients: closed loops of Ollama ``/api/chat`` streams, each timed to its first token.

TTFT is from the request sent to the first NDJSON line carrying content; the last line's
``load_duration`` (nanoseconds) says whether the request waited for its model to load;
the serving engine is named by the simulated engine's ``X-Fake-Engine`` header (relayed by
every router).
"""

from __future__ import annotations

import io
import json
import re
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.internet.protocol import connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers

from bench.residency.workload import Script, Workload

_CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')
TIMEOUT = 120.0
LOADED_AFTER = 0.1  # a load_duration above this: the request waited for a load


@attrs.define
class Record:
    """One request as its client saw it."""

    client: int
    model: str
    sent: float = 0.0
    status: int = 0
    ttft: float | None = None
    total: float = 0.0
    engine: str = ""
    loadSeconds: float = 0.0
    error: str = ""


class Router(Protocol):
    """Where each request goes: ``choose`` a base URL, told when it ``ended`` there."""

    def choose(self, model: str) -> str: ...

    def ended(self, url: str, model: str) -> None: ...


class _Body(TwistedProtocol):
    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.buf = bytearray()
        self.first: float | None = None
        self.done: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.buf += data
        if self.first is None and _CONTENT.search(self.buf):
            self.first = self.clock.seconds()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(bytes(self.buf))
        else:
            self.done.errback(reason)


def loadSeconds(body: bytes) -> float:
    """``load_duration`` of the stream's last line, in seconds (0 when absent)."""
    for line in reversed(body.split(b"\n")):
        if line.strip():
            try:
                doc = json.loads(line)
            except ValueError:
                return 0.0
            value = doc.get("load_duration") if isinstance(doc, dict) else None
            return value / 1e9 if isinstance(value, int) else 0.0
    return 0.0


class Clients:
    """Runs the workload's client loops through a router."""

    def __init__(self, reactor: Any, router: Router, workload: Workload) -> None:
        self.clock = IReactorTime(reactor)
        self.router = router
        self.workload = workload
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = 64
        self.pool = pool
        self.agent = Agent(reactor, pool=pool)
        self.records: list[Record] = []

    async def run(self) -> list[Record]:
        """Every client's loop until the duration is over; every request's record."""
        end = self.clock.seconds() + self.workload.duration
        loops = [
            Deferred.fromCoroutine(self._loop(Script(self.workload, c), c, end))
            for c in range(self.workload.clients)
        ]
        await gatherResults(loops)
        await self.pool.closeCachedConnections()
        return self.records

    async def _loop(self, script: Script, client: int, end: float) -> None:
        while self.clock.seconds() < end:
            step = script.next()
            if step is None:
                return
            model, pause = step
            record = Record(client, model)
            self.records.append(record)
            await self._one(record)
            await deferLater(self.clock, pause, lambda: None)

    async def _one(self, record: Record) -> None:
        url = self.router.choose(record.model)
        doc = {
            "model": record.model,
            "messages": [{"role": "user", "content": f"hello {record.client}"}],
            "options": {"num_predict": self.workload.answerTokens},
        }
        producer = FileBodyProducer(io.BytesIO(json.dumps(doc).encode()))
        headers = Headers({b"content-type": [b"application/json"]})
        record.sent = self.clock.seconds()
        try:
            d = self.agent.request(b"POST", (url + "/api/chat").encode(), headers, producer)
            d.addTimeout(TIMEOUT, self.clock)
            response = await d
            record.status = response.code
            body = _Body(self.clock)
            response.deliverBody(body)
            raw = await body.done
        except Exception as e:
            record.error = type(e).__name__
            return
        finally:
            record.total = self.clock.seconds() - record.sent
            self.router.ended(url, record.model)
        if record.status != 200:
            record.error = f"status {record.status}"
            return
        named = response.headers.getRawHeaders(b"x-fake-engine")
        record.engine = named[0].decode() if named else "?"
        record.ttft = None if body.first is None else body.first - record.sent
        record.loadSeconds = loadSeconds(raw)
