"""Response bodies of both dialects, and measuring one, for the tests of routing.stats."""

from __future__ import annotations

import json
from collections.abc import Mapping

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


def namedEvents(events: list[tuple[str, dict[str, object]]]) -> bytes:
    """SSE with named events (``event: NAME`` then ``data: JSON``), as the Messages and the
    Responses streams of llama.cpp and Ollama are written."""
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(data).encode())
        for name, data in events
    )


def messagesStream(
    texts: list[str],
    start: Mapping[str, object] | None,
    delta: Mapping[str, object] | None,
    end: bool = True,
) -> bytes:
    """An Anthropic Messages stream: ``message_start`` (with ``start`` as its usage),
    a text block of one delta per piece, ``message_delta`` (with ``delta`` as its usage),
    ``message_stop``."""
    message: dict[str, object] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "stop_sequence": None,
    }
    if start is not None:
        message["usage"] = start
    events: list[tuple[str, dict[str, object]]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
    ]
    for text in texts:
        events.append(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
        )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    final: dict[str, object] = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    if delta is not None:
        final["usage"] = delta
    events.append(("message_delta", final))
    if end:
        events.append(("message_stop", {"type": "message_stop"}))
    return namedEvents(events)


def responsesStream(
    texts: list[str],
    usage: Mapping[str, object] | None,
    timings: Mapping[str, object] | None = None,
    end: bool = True,
) -> bytes:
    """An OpenAI Responses stream: ``response.created``, one ``response.output_text.delta``
    per piece, then ``response.completed`` carrying the whole output and ``usage`` (and
    llama.cpp's ``timings`` beside the response)."""
    created = {"id": "resp_1", "object": "response", "status": "in_progress", "usage": None}
    events: list[tuple[str, dict[str, object]]] = [
        ("response.created", {"type": "response.created", "response": created}),
    ]
    for text in texts:
        events.append(
            ("response.output_text.delta", {"type": "response.output_text.delta", "delta": text})
        )
    response: dict[str, object] = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "".join(texts)}]}
        ],
        "usage": usage,
    }
    completed: dict[str, object] = {"type": "response.completed", "response": response}
    if timings is not None:
        completed["timings"] = timings
    if end:
        events.append(("response.completed", completed))
    return namedEvents(events)
