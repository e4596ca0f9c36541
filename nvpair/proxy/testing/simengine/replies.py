"""What a simulated engine writes for an inference request, in each dialect.

Usage is reported as the real engines report it:

* ``llamacpp`` (llama-server, as its ``server-task.cpp`` builds them): ``usage`` with
  ``prompt_tokens`` (the whole prompt) and ``prompt_tokens_details.cached_tokens``, and the
  ``timings`` object (``cache_n``, ``prompt_n`` = the tokens actually evaluated,
  ``prompt_ms``, ``predicted_n``, ``predicted_ms``, ...) on the non-streamed body; streamed,
  ``timings`` always ride on the last chunk, and ``usage`` on a last chunk with no choices
  only with ``stream_options.include_usage`` (completions: on the finishing chunk, always);
* ``lmstudio``: plain OpenAI ``usage`` (no cached count), streamed only with
  ``stream_options.include_usage``, in a last chunk whose ``choices`` is empty;
* ``ollama``: native routes end with ``prompt_eval_count`` (the whole prompt), ``eval_count``
  and durations, no cached count; its OpenAI routes report plain ``usage`` like LM Studio.
"""

from __future__ import annotations

import json
from typing import Protocol

import attrs

from nvpair.proxy.testing.fakeengine.dialects import CREATED, CREATED_AT, Route


def dumps(obj: object) -> bytes:
    """Compact JSON, as engines send it."""
    return json.dumps(obj, separators=(",", ":")).encode()


@attrs.frozen
class Usage:
    """What one request cost: tokens and milliseconds."""

    prompt: int
    cached: int
    completion: int
    promptMs: float
    predictedMs: float
    loadMs: float = 0.0  # waited for the model to load (Ollama's ``load_duration``)

    def openai(self, details: bool) -> dict[str, object]:
        """The OpenAI ``usage`` object (with ``prompt_tokens_details`` when ``details``)."""
        usage: dict[str, object] = {
            "completion_tokens": self.completion,
            "prompt_tokens": self.prompt,
            "total_tokens": self.prompt + self.completion,
        }
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return usage

    def timings(self) -> dict[str, object]:
        """llama-server's ``timings`` object."""
        evaluated = self.prompt - self.cached
        return {
            "cache_n": self.cached,
            "prompt_n": evaluated,
            "prompt_ms": self.promptMs,
            "prompt_per_token_ms": self.promptMs / evaluated if evaluated else 0.0,
            "prompt_per_second": 1000.0 * evaluated / self.promptMs if self.promptMs else 0.0,
            "predicted_n": self.completion,
            "predicted_ms": self.predictedMs,
            "predicted_per_token_ms": self.predictedMs / self.completion
            if self.completion
            else 0.0,
            "predicted_per_second": 1000.0 * self.completion / self.predictedMs
            if self.predictedMs
            else 0.0,
        }

    def ollama(self) -> dict[str, object]:
        """Ollama's counters on the last line (durations in nanoseconds)."""
        prompt = int(self.promptMs * 1e6)
        predicted = int(self.predictedMs * 1e6)
        load = int(self.loadMs * 1e6)
        return {
            "total_duration": load + prompt + predicted,
            "load_duration": load,
            "prompt_eval_count": self.prompt,
            "prompt_eval_duration": prompt,
            "eval_count": self.completion,
            "eval_duration": predicted,
        }


class Replier(Protocol):
    """What a run needs of the way its answer is written (``Reply`` for chat and
    completions, ``agents``' for Messages and Responses)."""

    @property
    def model(self) -> str: ...
    @property
    def contentType(self) -> bytes: ...
    def first(self, usage: Usage | None = None) -> bytes: ...
    def piece(self, text: str) -> bytes: ...
    def last(self, usage: Usage) -> bytes: ...
    def document(self, text: str, usage: Usage) -> bytes: ...


@attrs.frozen
class Reply:
    """How to answer one inference request: its dialect, route, model and name."""

    dialect: str
    route: Route
    model: str
    ident: str
    includeUsage: bool = False

    @property
    def native(self) -> bool:
        """Ollama's native routes (NDJSON), as opposed to OpenAI-style ones (SSE)."""
        return self.route is Route.OLLAMA_CHAT or self.route is Route.OLLAMA_GENERATE

    @property
    def contentType(self) -> bytes:
        """The content type of a streamed answer."""
        return b"application/x-ndjson" if self.native else b"text/event-stream"

    def _chunk(self, choice: dict[str, object]) -> dict[str, object]:
        chat = self.route is Route.CHAT
        return {
            "choices": [choice],
            "created": CREATED,
            "id": self.ident,
            "model": self.model,
            "system_fingerprint": "sim",
            "object": "chat.completion.chunk" if chat else "text_completion",
        }

    def first(self, usage: Usage | None = None) -> bytes:
        """The event sent when the request starts streaming (llama-server's role chunk), or
        nothing (``usage``, the prompt's, is for the APIs that report it there)."""
        if self.route is not Route.CHAT:
            return b""
        delta = {"role": "assistant", "content": None}
        choice: dict[str, object] = {"finish_reason": None, "index": 0, "delta": delta}
        return b"data: " + dumps(self._chunk(choice)) + b"\n\n"

    def piece(self, text: str) -> bytes:
        """One streamed event carrying ``text``."""
        if self.native:
            line: dict[str, object] = {"model": self.model, "created_at": CREATED_AT}
            if self.route is Route.OLLAMA_CHAT:
                line["message"] = {"role": "assistant", "content": text}
            else:
                line["response"] = text
            line["done"] = False
            return dumps(line) + b"\n"
        choice: dict[str, object]
        if self.route is Route.CHAT:
            choice = {"finish_reason": None, "index": 0, "delta": {"content": text}}
        else:
            choice = {"finish_reason": None, "index": 0, "text": text, "logprobs": None}
        return b"data: " + dumps(self._chunk(choice)) + b"\n\n"

    def last(self, usage: Usage) -> bytes:
        """The events that end a stream: the finish, the usage as the dialect reports it."""
        if self.native:
            doc: dict[str, object] = {"model": self.model, "created_at": CREATED_AT}
            if self.route is Route.OLLAMA_CHAT:
                doc["message"] = {"role": "assistant", "content": ""}
            else:
                doc["response"] = ""
            doc.update(done=True, done_reason="stop", **usage.ollama())
            return dumps(doc) + b"\n"
        choice: dict[str, object]
        if self.route is Route.CHAT:
            choice = {"finish_reason": "stop", "index": 0, "delta": {}}
        else:
            choice = {"finish_reason": "stop", "index": 0, "text": "", "logprobs": None}
        final = self._chunk(choice)
        out = [final]
        llama = self.dialect == "llamacpp"
        if llama and self.route is Route.COMPLETION:
            final["usage"] = usage.openai(True)  # llama-server's completions: always
        elif self.includeUsage:
            tail = self._chunk(choice)
            tail["choices"] = []
            tail["usage"] = usage.openai(llama)
            out.append(tail)
        if llama:
            out[-1]["timings"] = usage.timings()
        return b"".join(b"data: " + dumps(ev) + b"\n\n" for ev in out) + b"data: [DONE]\n\n"

    def document(self, text: str, usage: Usage) -> bytes:
        """The whole non-streamed answer."""
        if self.native:
            doc: dict[str, object] = {"model": self.model, "created_at": CREATED_AT}
            if self.route is Route.OLLAMA_CHAT:
                doc["message"] = {"role": "assistant", "content": text}
            else:
                doc["response"] = text
            doc.update(done=True, done_reason="stop", **usage.ollama())
            return dumps(doc)
        choice: dict[str, object]
        if self.route is Route.CHAT:
            message = {"role": "assistant", "content": text}
            choice = {"finish_reason": "stop", "index": 0, "message": message}
        else:
            choice = {"finish_reason": "stop", "index": 0, "text": text, "logprobs": None}
        doc = {
            "choices": [choice],
            "created": CREATED,
            "model": self.model,
            "system_fingerprint": "sim",
            "object": "chat.completion" if self.route is Route.CHAT else "text_completion",
            "id": self.ident,
        }
        llama = self.dialect == "llamacpp"
        doc["usage"] = usage.openai(llama)
        if llama:
            doc["timings"] = usage.timings()
        return dumps(doc)


def errorBody(dialect: str, native: bool, status: int, message: str, kind: str) -> bytes:
    """An error document in the engine's shape (Ollama's native routes: a plain string)."""
    if native:
        return dumps({"error": message})
    return dumps({"error": {"code": status, "message": message, "type": kind}})
