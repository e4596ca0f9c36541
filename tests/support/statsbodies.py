"""Response bodies of both dialects, and measuring one, for the tests of routing.stats."""

from __future__ import annotations

import json

from nvpair.proxy.routing.stats import StatsMeter


def sseBody(contents: list[str], usage: dict[str, int] | None = None, done: bool = True) -> bytes:
    """An OpenAI chat-completions SSE stream with one chunk per content piece."""
    events: list[dict[str, object]] = [
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": c}}]}
        for c in contents
    ]
    if usage is not None:
        events.append(
            {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        )
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    if done:
        out += b"data: [DONE]\n\n"
    return out


def ndjsonBody(contents: list[str], final: dict[str, object] | None) -> bytes:
    """An Ollama /api/chat NDJSON stream, with ``final`` merged into a done line if given."""
    lines: list[dict[str, object]] = [
        {"model": "m", "message": {"role": "assistant", "content": c}, "done": False}
        for c in contents
    ]
    if final is not None:
        lines.append(
            {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, **final}
        )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def measure(
    dialect: str,
    body: bytes,
    chunks: list[int] | None = None,
    created: float = 100.0,
    first: float = 100.5,
    end: float = 102.5,
    tailBytes: int = 8192,
) -> dict[str, object] | None:
    """Feed ``body`` to a fresh meter cut at the given chunk sizes and return its result."""
    meter = StatsMeter(dialect, created, tailBytes)
    meter.firstByte(first)
    pos = 0
    for size in chunks or [len(body)]:
        meter.feed(body[pos : pos + size])
        pos += size
    meter.feed(body[pos:])
    return meter.result(end)


USAGE = {"prompt_tokens": 12, "completion_tokens": 340, "total_tokens": 352}
