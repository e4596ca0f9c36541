"""What admission reads of a body (spec §5 "Bodies"): the facts routing acts on, bounded
model names, and which bodies are parsed whole, which only scanned (no prompt digests)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import LLAMACPP, LMSTUDIO, OLLAMA, RouteClass
from nvpair.proxy.routing import admission
from nvpair.proxy.routing.admission import MAX_MODEL, PARSE_LIMIT, Admitted, Refused, admit
from nvpair.proxy.routing.facts import MAX_FIELD, NO_FACTS, Identity, RequestFacts

FULL = {
    "model": "m",
    "metadata": {"user_id": "anthropic-user"},
    "safety_identifier": "safe-1",
    "user": "openai-user",
    "previous_response_id": "resp_1",
    "prompt_cache_key": "group-a",
    "cache_prompt": False,
    "stream": True,
}
FACTS = RequestFacts(
    Identity("anthropic-user", "safe-1", "openai-user"), "resp_1", "group-a", False, True
)


class Keyer:
    """A keyer that records what it was called with and answers a marker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def __call__(self, model: str, document: dict[str, object]) -> str:
        self.calls.append((model, document))
        return "digests"


def admitted(
    body: bytes, path: bytes = b"/v1/responses", keyer: Keyer | None = None
) -> Admitted[str]:
    decision = admit(LMSTUDIO, b"POST", path, body, keyer)
    assert isinstance(decision, Admitted), decision
    return decision


class FactsTests(SynchronousTestCase):
    """``RequestFacts`` from the body, each field bounded and typed."""

    def test_allFields(self) -> None:
        """Every field routing acts on is read."""
        self.assertEqual(admitted(json.dumps(FULL).encode()).facts, FACTS)

    def test_absentOrUnusable(self) -> None:
        """Missing, empty, over-long or mistyped fields are absent."""
        self.assertEqual(admitted(b'{"model": "m"}').facts, NO_FACTS)
        long = "x" * (MAX_FIELD + 1)
        doc = {
            "model": "m",
            "metadata": ["user_id"],
            "safety_identifier": "",
            "user": long,
            "previous_response_id": 5,
            "prompt_cache_key": long,
            "cache_prompt": "false",
            "stream": 1,
        }
        self.assertEqual(admitted(json.dumps(doc).encode()).facts, NO_FACTS)
        at = dict(doc, user="x" * MAX_FIELD, metadata={"user_id": 1})
        self.assertEqual(admitted(json.dumps(at).encode()).facts.identity.user, "x" * MAX_FIELD)

    def test_verbatimHasNoFacts(self) -> None:
        """A verbatim request carries its model only."""
        decision = admit(OLLAMA, b"POST", b"/api/show", json.dumps(FULL).encode())
        self.assertEqual(decision, Admitted(RouteClass.VERBATIM, "m:latest"))
        assert isinstance(decision, Admitted)
        self.assertEqual(decision.facts, NO_FACTS)


class ModelBoundTests(SynchronousTestCase):
    """A model name longer than ``MAX_MODEL`` characters never goes further (issue 32)."""

    def test_inferenceRefused(self) -> None:
        """Inference: 400 ``bad_request`` naming the bound, never the name; a name of
        exactly the bound is admitted."""
        name = "n" * (MAX_MODEL + 1)
        for engine, path in ((OLLAMA, b"/api/chat"), (LLAMACPP, b"/v1/chat/completions")):
            decision = admit(engine, b"POST", path, json.dumps({"model": name}).encode())
            self.assertIsInstance(decision, Refused)
            assert isinstance(decision, Refused)
            self.assertEqual((decision.status, decision.reason), (400, "bad_request"))
            self.assertIn(str(MAX_MODEL), decision.message)
            self.assertNotIn(name, decision.message)
        exact = "n" * MAX_MODEL
        self.assertEqual(admitted(json.dumps({"model": exact}).encode()).model, exact)

    def test_verbatimIgnored(self) -> None:
        """Verbatim: an over-long model is no model (no owner lookup)."""
        body = json.dumps({"model": "n" * (MAX_MODEL + 1)}).encode()
        self.assertEqual(
            admit(OLLAMA, b"POST", b"/api/show", body), Admitted(RouteClass.VERBATIM, None)
        )

    def test_realNames(self) -> None:
        """Real names fit: Ollama tags, Hugging Face repository ids, LM Studio and llama.cpp
        file paths."""
        for name in (
            "hf.co/bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M",
            "lmstudio-community/Qwen2.5-Coder-32B-Instruct-GGUF/Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf",
            "/home/someone/.cache/llama.cpp/" + "deep/" * 40 + "model-00001-of-00004.gguf",
        ):
            self.assertLessEqual(len(name), MAX_MODEL)
            self.assertEqual(admitted(json.dumps({"model": name}).encode()).model, name)


class ParseLimitTests(SynchronousTestCase):
    """Bodies within the limits are parsed whole (prompt digests); larger ones only scanned
    for their fields (no digests), in bounded time."""

    def test_keyerOnlyForWholeBodies(self) -> None:
        """The keyer gets the normalized model and the parsed document of an inference
        body; never for a refused, verbatim or scanned one."""
        keyer = Keyer()
        decision = admit(OLLAMA, b"POST", b"/api/chat", b'{"model": "m", "messages": []}', keyer)
        assert isinstance(decision, Admitted)
        self.assertEqual(decision.prefixKey, "digests")
        self.assertEqual(keyer.calls, [("m:latest", {"model": "m", "messages": []})])
        admit(OLLAMA, b"POST", b"/api/chat", b'{"messages": []}', keyer)
        admit(OLLAMA, b"POST", b"/api/show", b'{"model": "m"}', keyer)
        self.patch(admission, "PARSE_LIMIT", 10)
        scanned = admitted(b'{"model": "m", "stream": false}', keyer=keyer)
        self.assertEqual(
            (scanned.model, scanned.facts.stream, scanned.prefixKey), ("m", False, None)
        )
        self.assertEqual(len(keyer.calls), 1)

    def test_manySeparatorsScanned(self) -> None:
        """A body under the byte limit with more than ``MAX_VALUES`` separators (costly to
        parse) is scanned instead."""
        self.patch(admission, "MAX_VALUES", 100)
        keyer = Keyer()
        body = json.dumps({"model": "m", "x": [0] * 101, "user": "u"}).encode()
        decision = admitted(body, keyer=keyer)
        self.assertEqual((decision.model, decision.facts.identity.user), ("m", "u"))
        self.assertEqual(keyer.calls, [])
        admitted(json.dumps({"model": "m", "x": [0] * 90}).encode(), keyer=keyer)
        self.assertEqual(len(keyer.calls), 1)

    def test_largeBodyAtBothEnds(self) -> None:
        """A body over the limit: its fields are found before the prompt (Codex, curl) and
        after it (the Python SDKs), with no digests."""
        prompt = [{"role": "user", "content": "x" * 1000}] * (PARSE_LIMIT // 1000)
        keyer = Keyer()
        after = json.dumps({"input": prompt, **FULL}).encode()
        before = json.dumps({**FULL, "input": prompt}).encode()
        for body in (after, before):
            self.assertGreater(len(body), PARSE_LIMIT)
            decision = admitted(body, keyer=keyer)
            self.assertEqual((decision.model, decision.facts), ("m", FACTS))
        self.assertEqual(keyer.calls, [])

    def test_largeBodyModelOutOfReach(self) -> None:
        """A large body whose model lies beyond both windows is refused 400, saying where a
        large body is read."""
        self.patch(admission, "PARSE_LIMIT", 100)
        big = "y" * 300_000
        body = json.dumps({"a": big, "model": "m", "b": big}).encode()
        decision = admit(LLAMACPP, b"POST", b"/v1/chat/completions", body)
        self.assertIsInstance(decision, Refused)
        assert isinstance(decision, Refused)
        self.assertEqual(decision.status, 400)
        self.assertIn("first and last", decision.message)

    @settings(max_examples=100, deadline=None, database=None)
    @given(st.binary(max_size=200), st.integers(1, 200))
    def test_anyBodyAnyLimit(self, body: bytes, limit: int) -> None:
        """Any body under any limit: admitted with a model or refused 400, never an error."""
        self.patch(admission, "PARSE_LIMIT", limit)
        decision = admit(LLAMACPP, b"POST", b"/v1/chat/completions", body)
        if isinstance(decision, Refused):
            self.assertEqual(decision.status, 400)
        else:
            self.assertIsInstance(decision.model, str)
