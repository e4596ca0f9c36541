"""The engine table: everything engine-specific, one entry per engine (spec §10, protocol §11).

Adding an engine is adding an ``Engine`` to ``ENGINES``; nothing else names an engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import Enum

import attrs
from zope.interface import implementer

from nvpair.proxy.errorshape import IErrorShape


class RouteClass(Enum):
    """How a facade treats a request (protocol §11)."""

    INFERENCE = "inference"
    MODEL_ROUTED = "model-routed"  # to an owner of the body's model, not a workload
    FLEET_LIST = "list"
    VERBATIM = "verbatim"


def _identity(model: str) -> str:
    return model


def ollamaModel(model: str) -> str:
    """Ollama's implicit tag: a name without a tag means ``name:latest``."""
    return model if ":" in model.rsplit("/", 1)[-1] else model + ":latest"


MESSAGES = b"/v1/messages"
RESPONSES = b"/v1/responses"
COUNT_TOKENS = b"/v1/messages/count_tokens"
INPUT_TOKENS = b"/v1/responses/input_tokens"

# Our reasons (protocol §11) as Anthropic error types, chosen so that the ``anthropic`` SDK
# reads each like the API's own: it picks the exception class and the retry by status (408,
# 409, 429 and every 5xx are retried, honouring ``Retry-After``), the type names the cause.
ANTHROPIC_TYPES = {
    "no_owner": "not_found_error",
    "upstream_unreachable": "api_error",
    "no_content": "timeout_error",
    "deadline_exceeded": "overloaded_error",
    "owner_unavailable": "overloaded_error",
    "attempts_exhausted": "overloaded_error",
    "queue_full": "overloaded_error",
    "queue_timeout": "overloaded_error",
    "bad_request": "invalid_request_error",
    "body_too_large": "request_too_large",
    "host_denied": "permission_error",
    "internal": "api_error",
}


def anthropicType(reason: str) -> str:
    """The Anthropic error type for one of our reasons (``api_error`` for any other)."""
    return ANTHROPIC_TYPES.get(reason, "api_error")


def isMessagesPath(path: bytes) -> bool:
    """Whether ``path`` is Anthropic's Messages API (``/v1/messages`` and below it)."""
    return path == MESSAGES or path.startswith(b"/v1/messages/")


# What the statistics meter reads on the agents' routes (``routing.usage``), unless an engine
# says otherwise.
AGENT_DIALECTS: Mapping[bytes, str] = {MESSAGES: "anthropic", RESPONSES: "responses"}


@implementer(IErrorShape)
@attrs.frozen
class Engine:
    """One engine's identity, ports, routes, model normalization and error shapes."""

    id: str
    ownPort: int
    relocatedPort: int
    standalonePort: int
    portFile: str
    defaultBackend: str
    inferenceRoutes: frozenset[bytes]
    listRoutes: frozenset[bytes]
    inventoryRoute: bytes
    normalize: Callable[[str], str] = _identity
    nativeErrorPrefixes: tuple[bytes, ...] = ()
    listSources: Mapping[bytes, tuple[bytes, ...]] = attrs.field(factory=dict)
    # How standalone mode reads the engine's own state (spec §10): these paths in order, the
    # next one once a server answers 404 or 501 (routing/engineprobe.py parses each).
    stateProbes: tuple[bytes, ...] = ()
    # Protocol §11 "model-routed, not workloads": token counts, sent to an owner of the model.
    modelRoutes: frozenset[bytes] = frozenset()
    # The statistics meter's dialect on the agents' routes (by path).
    agentDialects: Mapping[bytes, str] = AGENT_DIALECTS
    # llama.cpp router mode (spec §11): a server answering its state probe 400 ("model name
    # is missing") is asked this list; statuses there mean a router, probed per model.
    routerProbe: bytes | None = None
    # Asked once per backend after its first state report: whether its prompt cache moves a
    # saved prompt to the request that matches it best (``nodestate.probes.parseIdentity``).
    identityProbe: bytes | None = None

    def listPaths(self, path: bytes) -> tuple[bytes, ...]:
        """Which path(s) to ask each node for a fleet list route: the first that is not 404."""
        return self.listSources.get(path, (path,))

    def classify(self, method: bytes, path: bytes) -> RouteClass:
        """Classify a request by method and path (without query)."""
        if method == b"POST" and path in self.inferenceRoutes:
            return RouteClass.INFERENCE
        if method == b"POST" and path in self.modelRoutes:
            return RouteClass.MODEL_ROUTED
        if method == b"GET" and path in self.listRoutes:
            return RouteClass.FLEET_LIST
        return RouteClass.VERBATIM

    def usesNativeErrors(self, path: bytes) -> bool:
        """Whether generated errors on this path use the engine's native (Ollama) shape."""
        return any(path.startswith(p) for p in self.nativeErrorPrefixes)

    def errorBody(self, path: bytes, reason: str, message: str) -> bytes:
        """The route's error shape for a response the proxy generates itself: Anthropic's on
        ``/v1/messages*`` (every engine), Ollama's on its native routes, else OpenAI's."""
        if isMessagesPath(path):
            doc: object = {
                "type": "error",
                "error": {"type": anthropicType(reason), "message": f"{message} ({reason})"},
            }
        elif self.usesNativeErrors(path):
            doc = {"error": message, "reason": reason}
        else:
            kind, param = _OPENAI_ERRORS.get(reason, ("proxy_error", None))
            error: dict[str, object] = {"message": message, "type": kind, "code": reason}
            if param is not None:
                error["param"] = param
            doc = {"error": error}
        return json.dumps(doc).encode("utf-8")

    def streamsByDefault(self, path: bytes) -> bool:
        """Ollama's native routes stream unless told not to; OpenAI-style ones do not."""
        return self.usesNativeErrors(path)

    def statsDialect(self, path: bytes) -> str:
        """Which body dialect the statistics meter reads on this route (``routing.usage``)."""
        dialect = self.agentDialects.get(path)
        if dialect is not None:
            return dialect
        return "ollama" if self.usesNativeErrors(path) else "openai"


_OPENAI = (b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings")

# Reasons the OpenAI shape names as the engines' own API does (type, param), not ours.
_OPENAI_ERRORS: Mapping[str, tuple[str, str | None]] = {
    "previous_response_not_found": ("invalid_request_error", "previous_response_id"),
}

OLLAMA = Engine(
    id="ollama",
    ownPort=11434,
    relocatedPort=11435,
    standalonePort=11435,
    portFile="proxy-port.json",
    defaultBackend="http://127.0.0.1:11434",
    inferenceRoutes=frozenset(
        (
            b"/api/generate",
            b"/api/chat",
            b"/api/embed",
            b"/api/embeddings",
            *_OPENAI,
            MESSAGES,
            RESPONSES,
        )
    ),
    listRoutes=frozenset((b"/api/tags", b"/v1/models")),
    inventoryRoute=b"/api/tags",
    normalize=ollamaModel,
    nativeErrorPrefixes=(b"/api/",),
    stateProbes=(b"/api/ps",),
    modelRoutes=frozenset((COUNT_TOKENS,)),
    # Its Responses usage always says ``cached_tokens: 0`` (a constant in its source, not a
    # count): read as not reported.
    agentDialects={MESSAGES: "anthropic", RESPONSES: "responses-uncached"},
)

LMSTUDIO = Engine(
    id="lmstudio",
    ownPort=1234,
    relocatedPort=1235,
    standalonePort=1234,
    portFile="lmstudio-proxy-port.json",
    defaultBackend="http://127.0.0.1:1235",
    inferenceRoutes=frozenset(
        (
            *_OPENAI,
            RESPONSES,
            MESSAGES,
            b"/api/v0/chat/completions",
            b"/api/v0/completions",
            b"/api/v0/embeddings",
        )
    ),
    listRoutes=frozenset((b"/v1/models", b"/api/v0/models")),
    inventoryRoute=b"/v1/models",
    stateProbes=(b"/api/v1/models", b"/api/v0/models"),
    modelRoutes=frozenset((COUNT_TOKENS,)),
)

LLAMACPP = Engine(
    id="llamacpp",
    ownPort=8080,
    relocatedPort=8081,
    standalonePort=8080,
    portFile="llamacpp-proxy-port.json",
    defaultBackend="http://127.0.0.1:8081",
    inferenceRoutes=frozenset((*_OPENAI, b"/v1/rerank", MESSAGES, RESPONSES)),
    listRoutes=frozenset((b"/models", b"/v1/models")),
    inventoryRoute=b"/v1/models",
    # Spec §5: both list routes are the fleet's GET /models; servers that only know the
    # OpenAI path (llama-cpp-python) answer it on /v1/models instead.
    listSources={
        b"/models": (b"/models", b"/v1/models"),
        b"/v1/models": (b"/models", b"/v1/models"),
    },
    stateProbes=(b"/slots", b"/metrics"),
    modelRoutes=frozenset((COUNT_TOKENS, INPUT_TOKENS)),
    routerProbe=b"/models",
    identityProbe=b"/props",
)

ENGINES: dict[str, Engine] = {e.id: e for e in (OLLAMA, LMSTUDIO, LLAMACPP)}
