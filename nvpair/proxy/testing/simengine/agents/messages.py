"""What a simulated engine writes for an Anthropic Messages request (spec §16).

Streamed, the real event sequence: ``message_start`` (the message with its input usage),
``content_block_start``, one ``content_block_delta`` (``text_delta``) per token,
``content_block_stop``, ``message_delta`` (stop reason and output usage), ``message_stop``;
each ``event: NAME`` then ``data: JSON``.  Usage as the engines report it:

* ``llamacpp`` (llama-server's ``server-task.cpp``): ``cache_read_input_tokens`` (the cached
  part), ``input_tokens`` (the rest of the prompt) and ``output_tokens``;
  ``message_delta`` carries ``output_tokens`` only; no ``timings`` on this route;
* ``ollama`` (its ``anthropic`` package) and ``lmstudio``: ``input_tokens`` (the whole
  prompt) and ``output_tokens``, no cache fields; ``message_delta`` repeats both.
"""

from __future__ import annotations

import attrs

from nvpair.proxy.testing.simengine.replies import Usage, dumps

SSE = b"text/event-stream"


def event(name: str, data: dict[str, object]) -> bytes:
    """One named SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


@attrs.frozen
class MessagesReply:
    """How to answer one Messages request: the engine's dialect, the model and the id."""

    dialect: str
    model: str
    ident: str
    contentType: bytes = SSE

    def usage(self, usage: Usage, final: bool) -> dict[str, object]:
        """The ``usage`` object as the dialect reports it (``final``: ``message_delta``'s)."""
        if self.dialect == "llamacpp":
            if final:
                return {"output_tokens": usage.completion}
            return {
                "cache_read_input_tokens": usage.cached,
                "input_tokens": usage.prompt - usage.cached,
                "output_tokens": usage.completion,
            }
        return {"input_tokens": usage.prompt, "output_tokens": usage.completion}

    def _message(self, content: list[object], usage: dict[str, object]) -> dict[str, object]:
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": "end_turn" if content else None,
            "stop_sequence": None,
            "usage": usage,
        }

    def first(self, usage: Usage | None = None) -> bytes:
        """``message_start`` (with the prompt's usage) and the text block's start."""
        start = usage if usage is not None else Usage(0, 0, 0, 0.0, 0.0)
        message = self._message([], self.usage(start, False))
        block = {"type": "text", "text": ""}
        return event("message_start", {"type": "message_start", "message": message}) + event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )

    def piece(self, text: str) -> bytes:
        """One ``content_block_delta`` carrying ``text``."""
        delta = {"type": "text_delta", "text": text}
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def last(self, usage: Usage) -> bytes:
        """The block's end, ``message_delta`` with the output usage, ``message_stop``."""
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        return (
            event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event(
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": self.usage(usage, True)},
            )
            + event("message_stop", {"type": "message_stop"})
        )

    def document(self, text: str, usage: Usage) -> bytes:
        """The whole non-streamed message."""
        content: list[object] = [{"type": "text", "text": text}]
        return dumps(self._message(content, self.usage(usage, False)))
