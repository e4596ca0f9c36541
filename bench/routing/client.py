"""Replays the workload's conversations against a router, timing each turn's first token.

Each conversation is one user: it sends its turn (the whole history, streamed), reads the
answer, appends it and thinks before the next turn. TTFT is from the request sent to the
first chunk carrying content (llama-server's role chunk does not count). Which engine
served a turn is read from the answer's id (``chatcmpl-NAME-N``, as the simulated engine
names itself) or its ``X-Fake-Engine`` header.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers

from bench.routing.workload import Conversation

_CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')
TIMEOUT = 120.0


@attrs.define
class Record:
    """One turn as the client saw it."""

    tenant: int
    user: int
    turn: int
    status: int = 0
    ttft: float | None = None
    total: float = 0.0
    engine: str = ""
    promptTokens: int = 0
    cachedTokens: int | None = None
    promptMs: float | None = None
    queueMs: float | None = None  # the simulated engine's FIFO wait (``X-Sim-Queue-Ms``)
    sent: float = 0.0
    error: str = ""


class _Body(Protocol):
    """Collects a streamed body, noting when the first content arrives."""

    def __init__(self, clock: IReactorTime, sent: float) -> None:
        self.clock = clock
        self.sent = sent
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


def parseStream(body: bytes) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """The answer text, the serving engine's name (from the id), the last usage and the
    last llama.cpp ``timings`` seen."""
    text: list[str] = []
    engine = ""
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for line in body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]" or not payload:
            continue
        event = json.loads(payload)
        ident = event.get("id")
        if isinstance(ident, str) and ident.count("-") >= 2 and not engine:
            engine = ident.split("-")[1]
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if isinstance(piece, str):
                text.append(piece)
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            timings = event["timings"]
    return "".join(text), engine, usage, timings


class Replayer:
    """Replays conversations; ``choose(conversation, turn)`` gives the base URL of each turn."""

    def __init__(
        self,
        reactor: Any,
        choose: Callable[[Conversation, int], str],
        model: str,
        answerTokens: int,
    ) -> None:
        self.reactor = reactor
        self.clock = IReactorTime(reactor)
        self.choose = choose
        self.model = model
        self.answerTokens = answerTokens
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = 256
        self.pool = pool
        self.agent = Agent(reactor, pool=pool)
        self.records: list[Record] = []

    async def run(self, conversations: list[Conversation]) -> list[Record]:
        """Replay every conversation; every turn's record."""
        await gatherResults([Deferred.fromCoroutine(self._conversation(c)) for c in conversations])
        await self.pool.closeCachedConnections()
        return self.records

    async def _conversation(self, conv: Conversation) -> None:
        await deferLater(self.clock, conv.start, lambda: None)
        messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
        for turn, question in enumerate(conv.questions):
            messages.append({"role": "user", "content": question})
            record = Record(conv.tenant, conv.user, turn)
            self.records.append(record)
            answer = await self._turn(self.choose(conv, turn), messages, record)
            if answer is None:
                return  # a failed turn ends the conversation (counted as an error)
            messages.append({"role": "assistant", "content": answer})
            if turn + 1 < len(conv.questions):
                await deferLater(self.clock, conv.pauses[turn], lambda: None)

    async def _turn(self, base: str, messages: list[dict[str, str]], record: Record) -> str | None:
        doc = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": self.answerTokens,
            "stream_options": {"include_usage": True},
        }
        producer = FileBodyProducer(io.BytesIO(json.dumps(doc).encode()))
        headers = Headers({b"content-type": [b"application/json"]})
        sent = self.clock.seconds()
        record.sent = sent
        url = (base + "/v1/chat/completions").encode()
        try:
            d = self.agent.request(b"POST", url, headers, producer)
            d.addTimeout(TIMEOUT, self.clock)
            response = await d
            record.status = response.code
            body = _Body(self.clock, sent)
            response.deliverBody(body)
            raw = await body.done
        except Exception as e:
            record.error = type(e).__name__
            record.total = self.clock.seconds() - sent
            return None
        record.total = self.clock.seconds() - sent
        if record.status != 200:
            record.error = f"status {record.status}"
            return None
        text, engine, usage, timings = parseStream(raw)
        named = response.headers.getRawHeaders(b"x-fake-engine")
        record.engine = engine or (named[0].decode() if named else "?")
        record.ttft = None if body.first is None else body.first - sent
        record.promptTokens = int(usage.get("prompt_tokens", 0))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            record.cachedTokens = details["cached_tokens"]
        promptMs = timings.get("prompt_ms")
        if isinstance(promptMs, (int, float)):
            record.promptMs = float(promptMs)
        queued = response.headers.getRawHeaders(b"x-sim-queue-ms")
        if queued:
            try:
                record.queueMs = float(queued[0])
            except ValueError:
                record.queueMs = None
        return text
