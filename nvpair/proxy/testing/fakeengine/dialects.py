"""What a fake engine says in each dialect: its routes, answer documents and stream events.

Two dialects, after the engines the proxy fronts (protocol.md §11):

* ``ollama``: Ollama's native ``/api/*`` routes (NDJSON streams, streaming unless the body
  says ``"stream": false``) and its OpenAI-compatible ``/v1/*`` routes;
* ``openai``: llama.cpp's and vLLM's OpenAI routes, with ``/v1/responses`` and
  ``/v1/rerank``, and LM Studio's ``/api/v0/*`` aliases (SSE streams, only when asked).

Everything here is a pure function of the route, the model, the ``Answer`` and the engine's
name, so the engine can cache the bytes it sends, and benchmarks can build exactly the bodies
an engine would send without running one.
"""

from __future__ import annotations

import enum
import json

from nvpair.proxy.testing.fakeengine.behaviours import Answer

CREATED = 1700000000
CREATED_AT = "2024-01-01T00:00:00Z"
PROMPT_TOKENS = 7
EMBEDDING = [0.1, 0.2, 0.3, 0.4]


class Route(enum.Enum):
    """The kind of inference a POST path asks for; ``OTHER`` is any path the engine ignores."""

    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RERANK = "rerank"
    RESPONSES = "responses"
    OLLAMA_CHAT = "ochat"
    OLLAMA_GENERATE = "ogenerate"
    OLLAMA_EMBED = "oembed"
    OLLAMA_EMBEDDINGS = "oembeddings"
    OTHER = "other"


class Listing(enum.Enum):
    """The shape of a model list: Ollama's ``/api/tags`` or OpenAI's ``/v1/models``."""

    TAGS = "tags"
    MODELS = "models"


_OPENAI_ROUTES = {
    b"/v1/chat/completions": Route.CHAT,
    b"/v1/completions": Route.COMPLETION,
    b"/v1/embeddings": Route.EMBEDDING,
}

ROUTES: dict[str, dict[bytes, Route]] = {
    "ollama": {
        **_OPENAI_ROUTES,
        b"/api/chat": Route.OLLAMA_CHAT,
        b"/api/generate": Route.OLLAMA_GENERATE,
        b"/api/embed": Route.OLLAMA_EMBED,
        b"/api/embeddings": Route.OLLAMA_EMBEDDINGS,
    },
    "openai": {
        **_OPENAI_ROUTES,
        b"/v1/responses": Route.RESPONSES,
        b"/v1/rerank": Route.RERANK,
        b"/api/v0/chat/completions": Route.CHAT,
        b"/api/v0/completions": Route.COMPLETION,
        b"/api/v0/embeddings": Route.EMBEDDING,
    },
}
"""POST path -> route, per dialect."""

LISTS: dict[str, dict[bytes, Listing]] = {
    "ollama": {b"/api/tags": Listing.TAGS, b"/v1/models": Listing.MODELS},
    "openai": {
        b"/v1/models": Listing.MODELS,
        b"/models": Listing.MODELS,
        b"/api/v0/models": Listing.MODELS,
    },
}
"""GET path -> model list shape, per dialect."""

DIALECTS = tuple(sorted(ROUTES))

STREAMABLE = frozenset(
    {Route.CHAT, Route.COMPLETION, Route.RESPONSES, Route.OLLAMA_CHAT, Route.OLLAMA_GENERATE}
)
"""The routes that answer with a stream when the request asks for one."""

OLLAMA_STREAMS = frozenset({Route.OLLAMA_CHAT, Route.OLLAMA_GENERATE})
"""The routes that stream unless asked not to (Ollama's native default)."""

_NATIVE = frozenset(
    {Route.OLLAMA_CHAT, Route.OLLAMA_GENERATE, Route.OLLAMA_EMBED, Route.OLLAMA_EMBEDDINGS}
)


def token(i: int) -> str:
    """Return the deterministic content of the i-th streamed chunk."""
    return f"tok{i}"


def content(chunks: int) -> str:
    """Return the full deterministic answer text made of ``chunks`` tokens."""
    return "".join(token(i) for i in range(chunks))


def dumps(obj: object) -> bytes:
    """Compact JSON, as engines send it."""
    return json.dumps(obj, separators=(",", ":")).encode()


def streamType(route: Route) -> bytes:
    """The content type of a streamed answer on ``route``."""
    return b"application/x-ndjson" if route in _NATIVE else b"text/event-stream"


def streamPieces(route: Route, model: str, answer: Answer, name: str) -> list[bytes]:
    """Return the events (unframed) of a streamed answer on a streamable ``route``."""
    n = answer.chunks
    pieces: list[bytes] = []
    if route is Route.CHAT or route is Route.COMPLETION:
        base: dict[str, object] = {"created": CREATED, "model": model}
        for i in range(n):
            finish = "stop" if i == n - 1 else None
            choice: dict[str, object]
            if route is Route.CHAT:
                choice = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": token(i)},
                    "finish_reason": finish,
                }
                ev = {"id": f"chatcmpl-{name}", "object": "chat.completion.chunk", **base}
            else:
                choice = {"index": 0, "text": token(i), "finish_reason": finish, "logprobs": None}
                ev = {"id": f"cmpl-{name}", "object": "text_completion", **base}
            ev["choices"] = [choice]
            pieces.append(b"data: " + dumps(ev) + b"\n\n")
        if answer.usage:
            obj = "chat.completion.chunk" if route is Route.CHAT else "text_completion"
            ev = {
                "id": f"chatcmpl-{name}",
                "object": obj,
                **base,
                "choices": [],
                "usage": _usage(n),
            }
            pieces.append(b"data: " + dumps(ev) + b"\n\n")
        pieces.append(b"data: [DONE]\n\n")
    elif route is Route.RESPONSES:
        for i in range(n):
            delta = {
                "type": "response.output_text.delta",
                "item_id": f"msg-{name}",
                "output_index": 0,
                "content_index": 0,
                "delta": token(i),
            }
            pieces.append(b"event: response.output_text.delta\ndata: " + dumps(delta) + b"\n\n")
        done = {"type": "response.completed", "response": _responsesDoc(model, answer, name)}
        pieces.append(b"event: response.completed\ndata: " + dumps(done) + b"\n\n")
    else:  # OLLAMA_CHAT, OLLAMA_GENERATE
        for i in range(n):
            line: dict[str, object] = {"model": model, "created_at": CREATED_AT}
            if route is Route.OLLAMA_CHAT:
                line["message"] = {"role": "assistant", "content": token(i)}
            else:
                line["response"] = token(i)
            line["done"] = False
            pieces.append(dumps(line) + b"\n")
        last: dict[str, object] = {"model": model, "created_at": CREATED_AT}
        if route is Route.OLLAMA_CHAT:
            last["message"] = {"role": "assistant", "content": ""}
        else:
            last["response"] = ""
        last.update(done=True, done_reason="stop", **(_ollamaUsage(n) if answer.usage else {}))
        pieces.append(dumps(last) + b"\n")
    return pieces


def _usage(n: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": n,
        "total_tokens": PROMPT_TOKENS + n,
    }


def _ollamaUsage(n: int) -> dict[str, int]:
    return {
        "total_duration": 1000000 + 1000 * n,
        "load_duration": 1000,
        "prompt_eval_count": PROMPT_TOKENS,
        "prompt_eval_duration": 1000,
        "eval_count": n,
        "eval_duration": 1000 * n,
    }


def _responsesDoc(model: str, answer: Answer, name: str) -> dict[str, object]:
    doc: dict[str, object] = {
        "id": f"resp-{name}",
        "object": "response",
        "created_at": CREATED,
        "model": model,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg-{name}",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": content(answer.chunks), "annotations": []}
                ],
            }
        ],
    }
    if answer.usage:
        doc["usage"] = {
            "input_tokens": PROMPT_TOKENS,
            "output_tokens": answer.chunks,
            "total_tokens": PROMPT_TOKENS + answer.chunks,
        }
    return doc


def document(route: Route, model: str, answer: Answer, name: str, inputs: int) -> bytes:
    """Return the non-streamed JSON document of an answer on an inference ``route``.

    ``inputs`` is how many embeddings or rerank results to return.
    """
    n = answer.chunks
    text = content(n)
    doc: dict[str, object]
    if route is Route.CHAT:
        doc = {
            "id": f"chatcmpl-{name}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
        }
    elif route is Route.COMPLETION:
        doc = {
            "id": f"cmpl-{name}",
            "object": "text_completion",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        }
    elif route is Route.EMBEDDING:
        doc = {
            "object": "list",
            "model": model,
            "data": [
                {"object": "embedding", "index": i, "embedding": EMBEDDING} for i in range(inputs)
            ],
        }
        if answer.usage:
            doc["usage"] = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS}
        return dumps(doc)
    elif route is Route.RERANK:
        doc = {
            "object": "list",
            "model": model,
            "results": [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(inputs)],
        }
        if answer.usage:
            doc["usage"] = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS}
        return dumps(doc)
    elif route is Route.RESPONSES:
        return dumps(_responsesDoc(model, answer, name))
    elif route is Route.OLLAMA_EMBED:
        doc = {"model": model, "embeddings": [EMBEDDING] * inputs}
        if answer.usage:
            doc.update(total_duration=1000, load_duration=100, prompt_eval_count=PROMPT_TOKENS)
        return dumps(doc)
    elif route is Route.OLLAMA_EMBEDDINGS:
        return dumps({"embedding": EMBEDDING})
    else:  # OLLAMA_CHAT, OLLAMA_GENERATE
        doc = {"model": model, "created_at": CREATED_AT}
        if route is Route.OLLAMA_CHAT:
            doc["message"] = {"role": "assistant", "content": text}
        else:
            doc["response"] = text
        doc.update(done=True, done_reason="stop", **(_ollamaUsage(n) if answer.usage else {}))
        return dumps(doc)
    if answer.usage:
        doc["usage"] = _usage(n)
    return dumps(doc)


def listDocument(listing: Listing, models: list[str]) -> bytes:
    """Return the model list document of ``models`` in the shape of ``listing``."""
    if listing is Listing.TAGS:
        return dumps(
            {
                "models": [
                    {
                        "name": m,
                        "model": m,
                        "modified_at": CREATED_AT,
                        "size": 1,
                        "digest": "0" * 64,
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "fake",
                            "families": ["fake"],
                            "parameter_size": "1B",
                            "quantization_level": "Q4_0",
                        },
                    }
                    for m in models
                ]
            }
        )
    return dumps(
        {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": CREATED, "owned_by": "fake"} for m in models
            ],
        }
    )
