"""The engine table (spec §8, §10; protocol §11): routes, normalization, error shapes."""

from __future__ import annotations

import json
from typing import get_args

from anthropic.types.shared.error_type import ErrorType
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import (
    ANTHROPIC_TYPES,
    ENGINES,
    LLAMACPP,
    LMSTUDIO,
    OLLAMA,
    RouteClass,
    ollamaModel,
)

INFERENCE = {
    "ollama": [
        "/api/generate",
        "/api/chat",
        "/api/embed",
        "/api/embeddings",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/responses",
    ],
    "lmstudio": [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/api/v0/chat/completions",
        "/api/v0/completions",
        "/api/v0/embeddings",
    ],
    "llamacpp": [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/messages",
        "/v1/responses",
    ],
}
MODEL_ROUTED = {
    "ollama": ["/v1/messages/count_tokens"],
    "lmstudio": ["/v1/messages/count_tokens"],
    "llamacpp": ["/v1/messages/count_tokens", "/v1/responses/input_tokens"],
}
LISTS = {
    "ollama": ["/api/tags", "/v1/models"],
    "lmstudio": ["/v1/models", "/api/v0/models"],
    "llamacpp": ["/models", "/v1/models"],
}
REASONS = [
    "no_owner",
    "upstream_unreachable",
    "no_content",
    "deadline_exceeded",
    "owner_unavailable",
    "attempts_exhausted",
    "bad_request",
    "body_too_large",
    "host_denied",
    "queue_full",
    "queue_timeout",
    "internal",
]


class TableTests(SynchronousTestCase):
    """Identity, ports and files of each engine."""

    def test_ids(self) -> None:
        """The three engine ids, in a stable order."""
        self.assertEqual(list(ENGINES), ["ollama", "lmstudio", "llamacpp"])

    def test_ports(self) -> None:
        """Own, relocated and standalone ports and port files follow the §8 table."""
        table = {
            "ollama": (11434, 11435, 11435, "proxy-port.json", "http://127.0.0.1:11434"),
            "lmstudio": (1234, 1235, 1234, "lmstudio-proxy-port.json", "http://127.0.0.1:1235"),
            "llamacpp": (8080, 8081, 8080, "llamacpp-proxy-port.json", "http://127.0.0.1:8081"),
        }
        for engineId, expected in table.items():
            e = ENGINES[engineId]
            self.assertEqual(
                (e.ownPort, e.relocatedPort, e.standalonePort, e.portFile, e.defaultBackend),
                expected,
            )


class ClassificationTests(SynchronousTestCase):
    """Every route of protocol §11 is classified; everything else is verbatim."""

    def test_inference(self) -> None:
        """Each inference route (POST) is INFERENCE for its engine."""
        for engineId, paths in INFERENCE.items():
            for path in paths:
                self.assertIs(
                    ENGINES[engineId].classify(b"POST", path.encode()),
                    RouteClass.INFERENCE,
                    (engineId, path),
                )

    def test_inferenceNeedsPost(self) -> None:
        """The same paths with GET are verbatim."""
        for engineId, paths in INFERENCE.items():
            for path in paths:
                self.assertIs(
                    ENGINES[engineId].classify(b"GET", path.encode()),
                    RouteClass.VERBATIM,
                    (engineId, path),
                )

    def test_lists(self) -> None:
        """Each fleet model list (GET) is FLEET_LIST; POST to it is verbatim."""
        for engineId, paths in LISTS.items():
            for path in paths:
                engine = ENGINES[engineId]
                self.assertIs(engine.classify(b"GET", path.encode()), RouteClass.FLEET_LIST)
                self.assertIs(engine.classify(b"POST", path.encode()), RouteClass.VERBATIM)

    def test_exactlyTheProtocolsRoutes(self) -> None:
        """Each engine's inference and model-routed POST routes are exactly protocol §11's."""
        for engineId, engine in ENGINES.items():
            self.assertEqual({r.decode() for r in engine.inferenceRoutes}, set(INFERENCE[engineId]))
            self.assertEqual({r.decode() for r in engine.modelRoutes}, set(MODEL_ROUTED[engineId]))

    def test_modelRouted(self) -> None:
        """Token counts (POST) are MODEL_ROUTED where protocol §11 lists them; GET, and the
        unprefixed aliases llama-server also serves, are verbatim."""
        for engineId, paths in MODEL_ROUTED.items():
            engine = ENGINES[engineId]
            for path in paths:
                self.assertIs(engine.classify(b"POST", path.encode()), RouteClass.MODEL_ROUTED)
                self.assertIs(engine.classify(b"GET", path.encode()), RouteClass.VERBATIM)
        self.assertIs(LLAMACPP.classify(b"POST", b"/responses/input_tokens"), RouteClass.VERBATIM)
        self.assertIs(LLAMACPP.classify(b"POST", b"/responses"), RouteClass.VERBATIM)
        self.assertIs(OLLAMA.classify(b"POST", b"/v1/responses/input_tokens"), RouteClass.VERBATIM)

    def test_notOtherEnginesRoutes(self) -> None:
        """A route of one engine is not inference on another."""
        self.assertIs(OLLAMA.classify(b"POST", b"/v1/rerank"), RouteClass.VERBATIM)
        self.assertIs(LMSTUDIO.classify(b"POST", b"/api/chat"), RouteClass.VERBATIM)
        self.assertIs(LLAMACPP.classify(b"POST", b"/api/v0/completions"), RouteClass.VERBATIM)
        self.assertIs(LLAMACPP.classify(b"GET", b"/api/tags"), RouteClass.VERBATIM)
        self.assertIs(OLLAMA.classify(b"GET", b"/models"), RouteClass.VERBATIM)

    def test_verbatim(self) -> None:
        """Unlisted routes (pull, show, health, trailing slash) are forwarded verbatim."""
        for method, path in [
            (b"POST", b"/api/pull"),
            (b"POST", b"/api/show"),
            (b"GET", b"/health"),
            (b"POST", b"/api/chat/"),
            (b"DELETE", b"/api/delete"),
            (b"OPTIONS", b"/api/chat"),
        ]:
            self.assertIs(OLLAMA.classify(method, path), RouteClass.VERBATIM)


class NormalizationTests(SynchronousTestCase):
    """Ollama's implicit ``:latest``; the others match exactly."""

    def test_ollama(self) -> None:
        """A name without a tag gains ``:latest``; tagged names and registry ports are kept."""
        cases = {
            "llama3": "llama3:latest",
            "llama3:latest": "llama3:latest",
            "llama3:8b": "llama3:8b",
            "library/llama3": "library/llama3:latest",
            "registry.local:5000/ns/model": "registry.local:5000/ns/model:latest",
            "registry.local:5000/ns/model:q4": "registry.local:5000/ns/model:q4",
        }
        for given, expected in cases.items():
            self.assertEqual(ollamaModel(given), expected)
            self.assertEqual(OLLAMA.normalize(given), expected)

    def test_exact(self) -> None:
        """LM Studio and llama.cpp ids are not touched."""
        for engine in (LMSTUDIO, LLAMACPP):
            self.assertEqual(engine.normalize("qwen2.5-7b"), "qwen2.5-7b")
            self.assertEqual(engine.normalize("org/model"), "org/model")


class ErrorShapeTests(SynchronousTestCase):
    """Generated errors use the engine's shape; Ollama's ``/v1/*`` uses the OpenAI shape."""

    def test_ollamaNative(self) -> None:
        """Ollama ``/api/*`` errors are ``{"error": message, "reason": reason}``."""
        for reason in REASONS:
            doc = json.loads(OLLAMA.errorBody(b"/api/chat", reason, "msg"))
            self.assertEqual(doc, {"error": "msg", "reason": reason})

    def test_openAI(self) -> None:
        """Every other route of every engine uses the OpenAI error object."""
        cases = [
            (OLLAMA, b"/v1/chat/completions"),
            (OLLAMA, b"/v1/models"),
            (LMSTUDIO, b"/v1/chat/completions"),
            (LMSTUDIO, b"/api/v0/completions"),
            (LLAMACPP, b"/v1/rerank"),
            (LLAMACPP, b"/models"),
        ]
        for engine, path in cases:
            for reason in REASONS:
                doc = json.loads(engine.errorBody(path, reason, "msg"))
                self.assertEqual(
                    doc,
                    {"error": {"message": "msg", "type": "proxy_error", "code": reason}},
                    (engine.id, path),
                )

    def test_anthropic(self) -> None:
        """``/v1/messages*`` on every engine (Ollama's too) answers in Anthropic's shape, the
        reason kept visible in the message, the type from the spec's table."""
        for engine in ENGINES.values():
            for path in (b"/v1/messages", b"/v1/messages/count_tokens", b"/v1/messages/x"):
                for reason in REASONS:
                    doc = json.loads(engine.errorBody(path, reason, "msg"))
                    self.assertEqual(
                        doc,
                        {
                            "type": "error",
                            "error": {
                                "type": ANTHROPIC_TYPES[reason],
                                "message": f"msg ({reason})",
                            },
                        },
                    )
        doc = json.loads(OLLAMA.errorBody(b"/v1/messagesx", "no_owner", "msg"))
        self.assertEqual(doc["error"]["type"], "proxy_error")
        self.assertEqual(
            json.loads(LLAMACPP.errorBody(b"/v1/messages", "other", "m"))["error"]["type"],
            "api_error",
        )

    def test_anthropicTypesTheSDKKnows(self) -> None:
        """Every type the table uses is one the ``anthropic`` SDK names (``ErrorType``), or
        ``request_too_large``, the type Anthropic's error reference gives its 413; every
        reason of protocol §11 has one."""
        known = set(get_args(ErrorType)) | {"request_too_large"}
        self.assertLessEqual(set(ANTHROPIC_TYPES.values()), known)
        self.assertEqual(set(ANTHROPIC_TYPES), set(REASONS))

    def test_dialects(self) -> None:
        """Ollama's native routes stream by default and read as the Ollama dialect; the
        agents' routes read as Anthropic's and the Responses' (Ollama's without its constant
        cached count)."""
        self.assertTrue(OLLAMA.streamsByDefault(b"/api/generate"))
        self.assertFalse(OLLAMA.streamsByDefault(b"/v1/completions"))
        self.assertFalse(OLLAMA.streamsByDefault(b"/v1/messages"))
        self.assertEqual(OLLAMA.statsDialect(b"/api/chat"), "ollama")
        self.assertEqual(OLLAMA.statsDialect(b"/v1/chat/completions"), "openai")
        self.assertEqual(LMSTUDIO.statsDialect(b"/api/v0/chat/completions"), "openai")
        for engine in ENGINES.values():
            self.assertEqual(engine.statsDialect(b"/v1/messages"), "anthropic")
        self.assertEqual(OLLAMA.statsDialect(b"/v1/responses"), "responses-uncached")
        self.assertEqual(LMSTUDIO.statsDialect(b"/v1/responses"), "responses")
        self.assertEqual(LLAMACPP.statsDialect(b"/v1/responses"), "responses")
