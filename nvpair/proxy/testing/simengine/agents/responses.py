"""What a simulated engine writes for an OpenAI Responses request (spec §16).

Streamed: ``response.created`` and ``response.in_progress`` (the response, no usage yet),
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per token, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and ``response.completed``
(the whole response with its ``usage``); each ``event: NAME`` then ``data: JSON``.  Usage as
the engines report it:

* ``llamacpp``: ``input_tokens`` (the whole prompt), ``output_tokens``, ``total_tokens``,
  ``input_tokens_details.cached_tokens``; ``timings`` beside ``response`` in the
  ``response.completed`` event;
* ``ollama``: the same fields, ``cached_tokens`` always 0 (its source's constant), and
  ``output_tokens_details.reasoning_tokens`` 0;
* ``lmstudio``: ``input_tokens``, ``output_tokens``, ``total_tokens``.

An answer that ends is stored (``stored``) when the engine keeps responses (LM Studio) and
the request did not say ``"store": false``: its id then names the conversation it ended with.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from nvpair.proxy.testing.fakeengine.dialects import CREATED
from nvpair.proxy.testing.simengine.agents.messages import SSE, event
from nvpair.proxy.testing.simengine.agents.stored import StoredResponses
from nvpair.proxy.testing.simengine.replies import Usage, dumps
from nvpair.proxy.testing.simengine.tokens import outputWord


@attrs.define
class ResponsesReply:
    """How to answer one Responses request, and where its conversation is kept (or None)."""

    dialect: str
    model: str
    ident: str
    prompt: Sequence[str]
    stored: StoredResponses | None = None
    previous: str | None = None
    contentType: bytes = SSE
    sequence: int = 0

    @property
    def itemId(self) -> str:
        """The id of the answer's one output message."""
        return "msg_" + self.ident.removeprefix("resp_")

    def usage(self, usage: Usage) -> dict[str, object]:
        """The ``usage`` object as the dialect reports it."""
        doc: dict[str, object] = {
            "input_tokens": usage.prompt,
            "output_tokens": usage.completion,
            "total_tokens": usage.prompt + usage.completion,
        }
        if self.dialect == "llamacpp":
            doc["input_tokens_details"] = {"cached_tokens": usage.cached}
        elif self.dialect == "ollama":
            doc["input_tokens_details"] = {"cached_tokens": 0}
            doc["output_tokens_details"] = {"reasoning_tokens": 0}
        return doc

    def _text(self, text: str) -> dict[str, object]:
        return {"type": "output_text", "text": text, "annotations": []}

    def _item(self, text: str | None) -> dict[str, object]:
        return {
            "id": self.itemId,
            "type": "message",
            "status": "in_progress" if text is None else "completed",
            "role": "assistant",
            "content": [] if text is None else [self._text(text)],
        }

    def _response(self, text: str | None, usage: Usage | None) -> dict[str, object]:
        doc: dict[str, object] = {
            "id": self.ident,
            "object": "response",
            "created_at": CREATED,
            "status": "in_progress" if usage is None else "completed",
            "model": self.model,
            "output": [] if text is None else [self._item(text)],
            "previous_response_id": self.previous if self.dialect == "lmstudio" else None,
            "usage": None if usage is None else self.usage(usage),
        }
        if usage is not None:
            doc["completed_at"] = CREATED
        return doc

    def _event(self, name: str, data: dict[str, object]) -> bytes:
        data = {"type": name, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return event(name, data)

    def first(self, usage: Usage | None = None) -> bytes:
        """The response's creation and its output message's start."""
        ids = {"item_id": self.itemId, "output_index": 0, "content_index": 0}
        return (
            self._event("response.created", {"response": self._response(None, None)})
            + self._event("response.in_progress", {"response": self._response(None, None)})
            + self._event(
                "response.output_item.added", {"output_index": 0, "item": self._item(None)}
            )
            + self._event("response.content_part.added", {**ids, "part": self._text("")})
        )

    def piece(self, text: str) -> bytes:
        """One ``response.output_text.delta`` carrying ``text``."""
        return self._event(
            "response.output_text.delta",
            {"item_id": self.itemId, "output_index": 0, "content_index": 0, "delta": text},
        )

    def _ended(self, usage: Usage) -> str:
        """The answer's text; the conversation stored when the engine keeps it."""
        answer = [outputWord(i) for i in range(usage.completion)]
        if self.stored is not None:
            self.stored.store(self.ident, [*self.prompt, *answer])
        return " ".join(answer)

    def last(self, usage: Usage) -> bytes:
        """The text, part and item done, then ``response.completed`` with the usage."""
        text = self._ended(usage)
        ids = {"item_id": self.itemId, "output_index": 0, "content_index": 0}
        completed: dict[str, object] = {"response": self._response(text, usage)}
        if self.dialect == "llamacpp":
            completed["timings"] = usage.timings()
        return (
            self._event("response.output_text.done", {**ids, "text": text})
            + self._event("response.content_part.done", {**ids, "part": self._text(text)})
            + self._event(
                "response.output_item.done", {"output_index": 0, "item": self._item(text)}
            )
            + self._event("response.completed", completed)
        )

    def document(self, text: str, usage: Usage) -> bytes:
        """The whole non-streamed response."""
        return dumps(self._response(self._ended(usage), usage))
