"""Streams requests to a router, timing each one's first content; replays chat conversations.

``Streamer`` posts one streamed request at a time over a shared connection pool and fills a
``Record``: TTFT is from the request sent to the first chunk carrying content (a pattern
per API: llama-server's role chunk and an empty Messages text block do not count). Which
engine served it: the simulated engine's ``X-Fake-Engine`` header, else the proxy's
``X-Nvpair-Node`` or the URL the client chose (named by ``names``), else the answer's id as
the simulated engine writes it (``chatcmpl-NAME-N``).

``Replayer`` replays chat conversations: each one user sending its turn (the whole history,
streamed), reading the answer, appending it and thinking before the next turn.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping
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

CHAT_CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')
TIMEOUT = 120.0


@attrs.define
class Record:
    """One request as the client saw it (``tenant`` is the app, ``user`` the conversation)."""

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
    kind: str = ""  # what sort of request (the free-slot workload's ``short`` or ``long``)


class _Body(Protocol):
    """Collects a streamed body, noting when the first content arrives."""

    def __init__(self, clock: IReactorTime, pattern: re.Pattern[bytes]) -> None:
        self.clock = clock
        self.pattern = pattern
        self.buf = bytearray()
        self.first: float | None = None
        self.done: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.buf += data
        if self.first is None and self.pattern.search(self.buf):
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


def _header(headers: Headers, name: bytes) -> str | None:
    values = headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


class Streamer:
    """Posts streamed requests; ``names`` maps each engine's base URL to its name."""

    def __init__(self, reactor: Any, names: Mapping[str, str] | None = None) -> None:
        self.clock = IReactorTime(reactor)
        self.names = dict(names or {})
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = 256
        self.pool = pool
        self.agent = Agent(reactor, pool=pool)

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.pool.closeCachedConnections()

    def engineOf(self, base: str, headers: Headers, ident: str) -> str:
        """The name of the engine that served a request sent to ``base``."""
        named = _header(headers, b"x-fake-engine")
        if named:
            return named
        node = _header(headers, b"x-nvpair-node")
        for url in (node, base):
            if url is not None and url.rstrip("/") in self.names:
                return self.names[url.rstrip("/")]
        if ident and (not self.names or ident in self.names.values()):
            return ident
        return "?"

    async def post(
        self,
        url: str,
        doc: dict[str, Any],
        record: Record,
        pattern: re.Pattern[bytes] = CHAT_CONTENT,
        extra: Mapping[bytes, bytes] | None = None,
    ) -> tuple[bytes, Headers] | None:
        """Send ``doc`` to ``url`` and read the streamed answer; fills ``record``'s status,
        times, queue wait and error; the body and headers when the answer was a 200."""
        producer = FileBodyProducer(io.BytesIO(json.dumps(doc).encode()))
        headers = Headers({b"content-type": [b"application/json"]})
        for name, value in (extra or {}).items():
            headers.setRawHeaders(name, [value])
        sent = self.clock.seconds()
        record.sent = sent
        try:
            d = self.agent.request(b"POST", url.encode(), headers, producer)
            d.addTimeout(TIMEOUT, self.clock)
            response = await d
            record.status = response.code
            body = _Body(self.clock, pattern)
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
        record.ttft = None if body.first is None else body.first - sent
        queued = _header(response.headers, b"x-sim-queue-ms")
        if queued is not None:
            try:
                record.queueMs = float(queued)
            except ValueError:
                record.queueMs = None
        return raw, response.headers


def chatDocument(model: str, messages: list[dict[str, str]], maxTokens: int) -> dict[str, Any]:
    """A streamed chat completion asking for usage."""
    return {
        "model": model,
        "messages": messages,
        "stream": True,
        "max_tokens": maxTokens,
        "stream_options": {"include_usage": True},
    }


async def chatTurn(
    streamer: Streamer,
    base: str,
    doc: dict[str, Any],
    record: Record,
) -> str | None:
    """One streamed chat completion through ``base``: the answer's text, or None on error
    (``record`` says what happened, with the usage and timings the engine reported)."""
    answered = await streamer.post(base + "/v1/chat/completions", doc, record)
    if answered is None:
        return None
    raw, headers = answered
    text, engine, usage, timings = parseStream(raw)
    record.engine = streamer.engineOf(base, headers, engine)
    record.promptTokens = int(usage.get("prompt_tokens", 0))
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        record.cachedTokens = details["cached_tokens"]
    elif isinstance(timings.get("cache_n"), int):
        record.cachedTokens = timings["cache_n"]
    promptMs = timings.get("prompt_ms")
    if isinstance(promptMs, (int, float)):
        record.promptMs = float(promptMs)
    return text


class Replayer:
    """Replays conversations; ``choose(conversation, turn)`` gives the base URL of each turn;
    ``extra`` fields are added to every request."""

    def __init__(
        self,
        reactor: Any,
        choose: Callable[[Conversation, int], str],
        model: str,
        answerTokens: int,
        names: Mapping[str, str] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self.clock = IReactorTime(reactor)
        self.choose = choose
        self.model = model
        self.answerTokens = answerTokens
        self.extra = dict(extra or {})
        self.streamer = Streamer(reactor, names)
        self.records: list[Record] = []

    async def run(self, conversations: list[Conversation]) -> list[Record]:
        """Replay every conversation; every turn's record."""
        await gatherResults([Deferred.fromCoroutine(self._conversation(c)) for c in conversations])
        await self.streamer.close()
        return self.records

    async def _conversation(self, conv: Conversation) -> None:
        await deferLater(self.clock, conv.start, lambda: None)
        messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
        for turn, question in enumerate(conv.questions):
            messages.append({"role": "user", "content": question})
            record = Record(conv.tenant, conv.user, turn)
            self.records.append(record)
            doc = {**chatDocument(self.model, messages, self.answerTokens), **self.extra}
            answer = await chatTurn(self.streamer, self.choose(conv, turn), doc, record)
            if answer is None:
                return  # a failed turn ends the conversation (counted as an error)
            messages.append({"role": "assistant", "content": answer})
            if turn + 1 < len(conv.questions):
                await deferLater(self.clock, conv.pauses[turn], lambda: None)
