"""Replays agent sessions over Anthropic's Messages API (``POST /v1/messages``, streamed).

TTFT is from the request sent to the first ``content_block_delta`` carrying text (the text
block's start, with its empty text, does not count). The prompt's tokens are what the
engine reported in ``message_start``: ``input_tokens`` (the part not read from cache) plus
``cache_read_input_tokens`` and ``cache_creation_input_tokens``; cached, the first of those.
The serving engine: as ``client.Streamer`` finds it, else the id's middle (``msg_NAME_N``,
as the simulated engine writes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from bench.routing.agents import Session, requestBody, toolTurns
from bench.routing.client import Record, Streamer

MESSAGES_CONTENT = re.compile(rb'"text"\s*:\s*"[^"]')
ANTHROPIC_VERSION = {b"anthropic-version": b"2023-06-01"}


def parseMessages(body: bytes) -> tuple[str, str, dict[str, int]]:
    """The answer text, the message id, and the usage (``message_start``'s, with
    ``message_delta``'s counts over it)."""
    text: list[str] = []
    ident = ""
    usage: dict[str, int] = {}
    for line in body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        event = json.loads(line[5:].strip() or b"{}")
        kind = event.get("type")
        found: object = None
        if kind == "message_start":
            message = event.get("message") or {}
            ident = str(message.get("id", ""))
            found = message.get("usage")
        elif kind == "message_delta":
            found = event.get("usage")
        elif kind == "content_block_delta":
            piece = (event.get("delta") or {}).get("text")
            if isinstance(piece, str):
                text.append(piece)
        if isinstance(found, dict):
            usage.update({k: v for k, v in found.items() if isinstance(v, int)})
    return "".join(text), ident, usage


def engineFromId(ident: str) -> str:
    """``msg_NAME_N`` -> ``NAME``; empty for other ids."""
    parts = ident.split("_")
    return parts[1] if len(parts) >= 3 and parts[0] == "msg" else ""


async def messagesTurn(
    streamer: Streamer, base: str, doc: dict[str, Any], record: Record
) -> str | None:
    """One streamed Messages request through ``base``: the answer's text, or None on error."""
    answered = await streamer.post(
        base + "/v1/messages", doc, record, MESSAGES_CONTENT, ANTHROPIC_VERSION
    )
    if answered is None:
        return None
    raw, headers = answered
    text, ident, usage = parseMessages(raw)
    record.engine = streamer.engineOf(base, headers, engineFromId(ident))
    cached = usage.get("cache_read_input_tokens", 0)
    record.promptTokens = (
        usage.get("input_tokens", 0) + cached + usage.get("cache_creation_input_tokens", 0)
    )
    record.cachedTokens = cached
    return text


class AgentReplayer:
    """Replays agent sessions; ``choose(session, turn)`` gives the base URL of each call."""

    def __init__(
        self,
        reactor: Any,
        choose: Callable[[Session, int], str],
        model: str,
        answerTokens: int,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.clock = IReactorTime(reactor)
        self.choose = choose
        self.model = model
        self.answerTokens = answerTokens
        self.streamer = Streamer(reactor, names)
        self.records: list[Record] = []

    async def run(self, sessions: list[Session]) -> list[Record]:
        """Replay every session; every call's record."""
        await gatherResults([Deferred.fromCoroutine(self._session(s)) for s in sessions])
        await self.streamer.close()
        return self.records

    async def _session(self, session: Session) -> None:
        await deferLater(self.clock, session.start, lambda: None)
        messages: list[dict[str, Any]] = [{"role": "user", "content": session.task}]
        for turn in range(session.turns):
            record = Record(session.tenant, session.user, turn)
            self.records.append(record)
            doc = {
                "model": self.model,
                **requestBody(session, messages),
                "max_tokens": self.answerTokens,
                "stream": True,
            }
            answer = await messagesTurn(self.streamer, self.choose(session, turn), doc, record)
            if answer is None:
                return  # a failed call ends the session (counted as an error)
            if turn + 1 < session.turns:
                messages = messages + toolTurns(session, turn, answer)
                await deferLater(self.clock, session.pauses[turn], lambda: None)
