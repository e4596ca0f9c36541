"""The agents' routes of a simulated engine, per dialect, and how each is answered (spec §16).

As the real engines serve them (protocol §11): every dialect answers ``POST /v1/messages``
and ``POST /v1/responses``; llama.cpp also ``/v1/messages/count_tokens``
(``{"input_tokens": N}``), ``/v1/responses/input_tokens`` (``{"input_tokens": N, "object":
"response.input_tokens"}``) and its unprefixed ``/responses`` aliases.  ``previous_response_id``
is what each engine makes of it: LM Studio continues the stored conversation (an unknown id
is 404 ``previous_response_not_found``), llama.cpp refuses it (400, its own words), Ollama
drops it (its request type has no such field) and answers from the input alone.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable

from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from nvpair.proxy.testing.simengine.agents.messages import MessagesReply
from nvpair.proxy.testing.simengine.agents.render import messagesWords, responsesWords
from nvpair.proxy.testing.simengine.agents.responses import ResponsesReply
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.replies import Replier, dumps, errorBody
from nvpair.proxy.testing.simengine.run import Run


class Agent(enum.Enum):
    """Which of the agents' APIs a route is."""

    MESSAGES = "messages"
    RESPONSES = "responses"
    COUNT_TOKENS = "count_tokens"
    INPUT_TOKENS = "input_tokens"


_BOTH = {b"/v1/messages": Agent.MESSAGES, b"/v1/responses": Agent.RESPONSES}

ROUTES: dict[str, dict[bytes, Agent]] = {
    "llamacpp": {
        **_BOTH,
        b"/responses": Agent.RESPONSES,
        b"/v1/messages/count_tokens": Agent.COUNT_TOKENS,
        b"/v1/responses/input_tokens": Agent.INPUT_TOKENS,
        b"/responses/input_tokens": Agent.INPUT_TOKENS,
    },
    "lmstudio": dict(_BOTH),
    "ollama": dict(_BOTH),
}
"""POST path -> the agents' API it is, per dialect."""

# The Anthropic error type of each kind of refusal the simulation makes.
_ANTHROPIC = {
    "invalid_request_error": "invalid_request_error",
    "exceed_context_size_error": "invalid_request_error",
    "not_found_error": "not_found_error",
    "unavailable_error": "overloaded_error",
}


def _errorBody(dialect: str, agent: Agent, status: int, message: str, kind: str) -> bytes:
    """A refusal in the engine's shape on that route: llama.cpp's OpenAI-like one on every
    route, Anthropic's on Ollama's and LM Studio's Messages route."""
    if agent is Agent.MESSAGES and dialect != "llamacpp":
        error = {"type": _ANTHROPIC.get(kind, "api_error"), "message": message}
        return dumps({"type": "error", "error": error})
    return errorBody(dialect, False, status, message, kind)


def _maxTokens(doc: dict[str, object], default: int, cap: int) -> int:
    for name in ("max_tokens", "max_output_tokens"):
        value = doc.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, cap)
    return min(default, cap)


def answer(core: Core, connection: EngineConnection, agent: Agent, body: bytes) -> None:
    """Answer one request on an agents' route: refuse it, count its tokens, or run it."""
    config = core.config
    dialect = config.dialect

    def refuse(status: int, message: str, kind: str) -> None:
        core.document(connection, status, _errorBody(dialect, agent, status, message, kind))

    try:
        doc: object = json.loads(body)
    except (ValueError, RecursionError):
        refuse(400, "the body is not JSON", "invalid_request_error")
        return
    if not isinstance(doc, dict):
        refuse(400, "the body must be a JSON object", "invalid_request_error")
        return
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        if dialect != "llamacpp":
            refuse(400, "model is required", "invalid_request_error")
            return
        model = config.models[0]
    served = core.resolve(model)
    if served is None:
        refuse(404, f"model '{model}' not found", "not_found_error")
        return
    conversation: list[str] | None = None
    previous = doc.get("previous_response_id")
    if agent is not Agent.MESSAGES and agent is not Agent.COUNT_TOKENS and previous:
        if dialect == "llamacpp":
            refuse(
                400, "llama.cpp does not support 'previous_response_id'.", "invalid_request_error"
            )
            return
        if dialect == "lmstudio" and isinstance(previous, str):
            conversation = core.stored.conversation(previous)
            if conversation is None:
                _notFound(core, connection, previous)
                return
    if agent is Agent.MESSAGES or agent is Agent.COUNT_TOKENS:
        words = messagesWords(doc)
    else:
        words = responsesWords(doc, conversation)
    if words is None:
        what = "'messages'" if agent in (Agent.MESSAGES, Agent.COUNT_TOKENS) else "'input'"
        refuse(400, f"{what} is required", "invalid_request_error")
        return
    if agent is Agent.COUNT_TOKENS:
        core.document(connection, 200, dumps({"input_tokens": len(words)}))
        return
    if agent is Agent.INPUT_TOKENS:
        counted = {"input_tokens": len(words), "object": "response.input_tokens"}
        core.document(connection, 200, dumps(counted))
        return
    _run(core, connection, agent, doc, model, served, words, previous, refuse)


def _notFound(core: Core, connection: EngineConnection, previous: str) -> None:
    """LM Studio's (and OpenAI's) answer to an unknown ``previous_response_id``."""
    error = {
        "message": f"Previous response with id '{previous}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    core.document(connection, 404, dumps({"error": error}))


def _run(
    core: Core,
    connection: EngineConnection,
    agent: Agent,
    doc: dict[str, object],
    model: str,
    served: str,
    words: list[str],
    previous: object,
    refuse: Callable[[int, str, str], None],
) -> None:
    """Run an inference request of the agents' APIs, as ``routes.inference`` runs chat."""
    config = core.config
    dialect = config.dialect
    core.stats.requests += 1

    def error(status: int, message: str, kind: str) -> bytes:
        return _errorBody(dialect, agent, status, message, kind)

    if core.turnedAway(connection, len(words), refuse, error):
        return
    n = core.stats.requests
    reply: Replier
    if agent is Agent.MESSAGES:
        reply = MessagesReply(dialect, model, f"msg_{config.name}_{n}")
    else:
        keeps = dialect == "lmstudio" and doc.get("store") is not False
        reply = ResponsesReply(
            dialect,
            model,
            f"resp_{config.name}_{n}",
            words,
            core.stored if keeps else None,
            previous if isinstance(previous, str) else None,
        )
    maxTokens = _maxTokens(doc, config.outputTokens, config.maxOutputTokens)
    run = Run(
        core, connection, reply, doc.get("stream") is True, words, maxTokens, core.untrack, served
    )
    core.track(connection, run)
    if not run.begin():
        core.untrack(run)
        core.stats.refused += 1
        refuse(
            503,
            "server busy, please try again. maximum pending requests exceeded",
            "unavailable_error",
        )
