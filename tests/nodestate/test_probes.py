"""The engine-state probe parsers: the real shapes read, garbage refused (never idle)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.nodestate.probes import (
    MAX_PROBE_BYTES,
    PARSERS,
    BadProbe,
    EngineReport,
    NotThisProbe,
    ResidentModel,
    parseProbe,
    withChildSlots,
)

SLOTS = [
    {"id": 0, "n_ctx": 4096, "is_processing": True, "params": {}},
    {"id": 1, "n_ctx": 4096, "is_processing": False},
    {"id": 2, "n_ctx": 4096, "is_processing": True},
]
METRICS = b"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
llamacpp:requests_processing 2
llamacpp:requests_deferred 0
"""


class ShapeTests(SynchronousTestCase):
    """Each engine's state endpoint, as the real servers answer it."""

    def test_slots(self) -> None:
        """llama.cpp ``/slots``: busy, total and the context the slots hold; older servers'
        ``state`` counts too."""
        report = parseProbe(b"/slots", json.dumps(SLOTS).encode())
        self.assertEqual(report, EngineReport(busy=2, total=3, contextTokens=12288))
        old = [{"id": 0, "state": 1}, {"id": 1, "state": 0}]
        self.assertEqual(parseProbe(b"/slots", json.dumps(old).encode()).busy, 1)

    def test_metrics(self) -> None:
        """llama.cpp ``/metrics``: busy from ``requests_processing``; the total is unknown
        unless requests wait (then every slot is busy)."""
        self.assertEqual(parseProbe(b"/metrics", METRICS), EngineReport(busy=2, total=None))
        waiting = METRICS.replace(b"deferred 0", b"deferred 3")
        self.assertEqual(parseProbe(b"/metrics", waiting), EngineReport(busy=2, total=2))

    def test_lmstudioAndOllama(self) -> None:
        """LM Studio's model states and Ollama's running models say what is loaded."""
        lms = {"data": [{"id": "a", "state": "loaded"}, {"id": "b", "state": "not-loaded"}]}
        report = parseProbe(b"/api/v0/models", json.dumps(lms).encode())
        self.assertEqual(report.loaded, frozenset({"a"}))
        self.assertIsNone(report.total)
        ps = {"models": [{"name": "x:latest", "model": "x:latest", "expires_at": "2030-01-01"}]}
        report = parseProbe(b"/api/ps", json.dumps(ps).encode())
        self.assertEqual(report.loaded, frozenset({"x:latest"}))
        self.assertEqual(report.expires, (("x:latest", "2030-01-01"),))
        self.assertEqual(parseProbe(b"/api/ps", b'{"models": []}').loaded, frozenset())

    def test_engineTable(self) -> None:
        """Every engine names its probes in the engine table, each with a parser."""
        self.assertEqual(ENGINES["llamacpp"].stateProbes, (b"/slots", b"/metrics"))
        self.assertEqual(ENGINES["lmstudio"].stateProbes, (b"/api/v1/models", b"/api/v0/models"))
        self.assertEqual(ENGINES["llamacpp"].routerProbe, b"/models")
        self.assertEqual(ENGINES["ollama"].stateProbes, (b"/api/ps",))
        for engine in ENGINES.values():
            for path in engine.stateProbes:
                self.assertIn(path, PARSERS)

    def test_ollamaSizes(self) -> None:
        """Ollama ``/api/ps`` as its ``PsHandler`` writes it: sizes, VRAM, expiry, context."""
        ps = {
            "models": [
                {
                    "name": "b:latest",
                    "model": "b:latest",
                    "size": 5_000,
                    "digest": "0" * 64,
                    "details": {"format": "gguf"},
                    "expires_at": "2030-01-01T00:05:00Z",
                    "size_vram": 4_000,
                    "context_length": 4096,
                },
                {"name": "a:latest", "model": "a:latest", "size": "big"},
            ]
        }
        report = parseProbe(b"/api/ps", json.dumps(ps).encode())
        self.assertEqual(
            report.resident,
            (
                ResidentModel("a:latest"),
                ResidentModel(
                    "b:latest",
                    sizeBytes=5000,
                    vramBytes=4000,
                    until="2030-01-01T00:05:00Z",
                    contextTokens=4096,
                ),
            ),
        )
        self.assertIsNone(report.installed)

    def test_lmstudioV1(self) -> None:
        """LM Studio's v1 REST API lists every model; one with an instance is loaded, with
        its instance id, context and parallel slots."""
        doc = {
            "models": [
                {
                    "type": "llm",
                    "key": "qwen",
                    "size_bytes": 7_000,
                    "loaded_instances": [
                        {"id": "qwen", "config": {"context_length": 8192, "parallel": 4}},
                        {"id": "qwen:2", "config": {"context_length": 4096}},
                    ],
                    "max_context_length": 32768,
                },
                {"type": "embedding", "key": "nomic", "loaded_instances": []},
            ]
        }
        report = parseProbe(b"/api/v1/models", json.dumps(doc).encode())
        self.assertEqual(report.loaded, frozenset({"qwen"}))
        self.assertEqual(report.installed, frozenset({"qwen", "nomic"}))
        self.assertEqual(
            report.resident,
            (
                ResidentModel(
                    "qwen", sizeBytes=7000, instance="qwen", contextTokens=8192, parallel=4
                ),
            ),
        )
        v0 = {"data": [{"id": "a", "state": "loaded"}, {"id": "b", "state": "not-loaded"}]}
        old = parseProbe(b"/api/v0/models", json.dumps(v0).encode())
        self.assertEqual((old.installed, old.resident), ({"a", "b"}, (ResidentModel("a"),)))

    def test_router(self) -> None:
        """llama.cpp router mode's ``/models``: each installed model's status (as
        ``server-models.cpp`` writes it); loaded, loading and sleeping ones are resident,
        only loaded ones count as loaded.  A list without statuses is no router."""

        def entry(name: str, value: str, **more: object) -> dict[str, object]:
            status: dict[str, object] = {"value": value, "args": ["llama-server"], **more}
            return {"id": name, "aliases": [], "object": "model", "status": status}

        doc = {
            "object": "list",
            "data": [
                entry("a", "loaded") | {"meta": {"n_ctx": 1024, "size": 246587904}},
                entry("b", "loading"),
                entry("c", "unloaded", failed=True, exit_code=1),
                entry("d", "sleeping"),
            ],
        }
        report = parseProbe(b"/models", json.dumps(doc).encode())
        self.assertTrue(report.router)
        self.assertEqual(report.loaded, frozenset({"a"}))
        self.assertEqual(report.installed, frozenset("abcd"))
        self.assertEqual(report.resident[0].sizeBytes, 246587904)  # type: ignore[index]
        self.assertEqual(
            [(r.name, r.state) for r in report.resident or ()],
            [("a", "loaded"), ("b", "loading"), ("d", "sleeping")],
        )
        single = {"object": "list", "data": [{"id": "m", "object": "model", "meta": {}}]}
        self.assertRaises(NotThisProbe, parseProbe, b"/models", json.dumps(single).encode())
        bad = {"data": [entry("a", "exploded")]}
        self.assertRaises(BadProbe, parseProbe, b"/models", json.dumps(bad).encode())

    def test_routerChildSlots(self) -> None:
        """Each loaded model's own slots fold into the router's report: per model, and
        summed for the node only when every loaded model's were read."""
        doc = {
            "data": [
                {"id": "a", "status": {"value": "loaded"}},
                {"id": "b", "status": {"value": "loaded"}},
                {"id": "c", "status": {"value": "loading"}},
            ]
        }
        report = parseProbe(b"/models", json.dumps(doc).encode())
        a = EngineReport(busy=1, total=2, contextTokens=100)
        b = EngineReport(busy=0, total=4, contextTokens=50)
        both = withChildSlots(report, {"a": a, "b": b})
        self.assertEqual((both.busy, both.total, both.contextTokens), (1, 6, 150))
        self.assertEqual(
            [(r.name, r.busy, r.total) for r in both.resident or ()],
            [("a", 1, 2), ("b", 0, 4), ("c", None, None)],
        )
        half = withChildSlots(report, {"a": a, "b": None})
        self.assertEqual((half.busy, half.total), (None, None))
        empty = parseProbe(b"/models", b'{"data": []}')
        self.assertEqual(withChildSlots(empty, {}).total, None)

    def test_wrongShapes(self) -> None:
        """Wrong types, missing fields, an empty slot list, a huge body: refused."""
        bad = {
            b"/slots": [b"[]", b"{}", b'[{"id": 0}]', b'[{"is_processing": "yes"}]', b"[1]"],
            b"/metrics": [b"", b"llamacpp:requests_processing NaN", b"other 1"],
            b"/api/v0/models": [b"[]", b'{"data": [{"id": 1, "state": "loaded"}]}'],
            b"/api/ps": [b'{"models": {}}', b'{"models": [{"name": 3}]}', b"null"],
            b"/api/v1/models": [
                b'{"data": []}',
                b'{"models": [{"key": 1}]}',
                b'{"models": [{"key": "a", "loaded_instances": {}}]}',
                b'{"models": [{"key": "a", "loaded_instances": [3]}]}',
            ],
            b"/models": [b"[]", b'{"data": [{"status": {"value": "loaded"}}]}', b'{"data": 1}'],
        }
        for path, bodies in bad.items():
            for body in bodies:
                self.assertRaises(BadProbe, parseProbe, path, body)
        huge = b"[" + b'{"is_processing": false},' * (MAX_PROBE_BYTES // 20) + b"{}]"
        self.assertRaises(BadProbe, parseProbe, b"/slots", huge)
        self.assertRaises(BadProbe, parseProbe, b"/metrics", b"#" * (MAX_PROBE_BYTES + 1))
        self.assertRaises(BadProbe, parseProbe, b"/unknown", b"{}")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)


class GarbageTests(SynchronousTestCase):
    """Whatever a probe answers, a parser returns a sane report or raises ``BadProbe``."""

    def check(self, path: bytes, body: bytes) -> None:
        try:
            report = parseProbe(path, body)
        except BadProbe:
            return
        for value in (report.busy, report.total, report.contextTokens):
            self.assertTrue(value is None or (type(value) is int and value >= 0))
        if report.busy is not None and report.total is not None and path == b"/slots":
            self.assertLessEqual(report.busy, report.total)
        for model in report.resident or ():
            self.assertTrue(type(model.name) is str and 0 < len(model.name) <= 512)
            self.assertIn(model.state, ("loaded", "loading", "sleeping"))
            for value in (model.sizeBytes, model.vramBytes, model.contextTokens, model.parallel):
                self.assertTrue(value is None or (type(value) is int and value >= 0))
            self.assertEqual(model.name in (report.loaded or ()), model.state == "loaded")
        if report.installed is not None and report.resident is not None:
            self.assertLessEqual({m.name for m in report.resident}, report.installed)

    @settings(max_examples=300)
    @given(st.sampled_from(sorted(PARSERS)), st.binary(max_size=300))
    def test_bytes(self, path: bytes, body: bytes) -> None:
        """Random bytes."""
        self.check(path, body)

    @settings(max_examples=300)
    @given(st.sampled_from(sorted(PARSERS)), _json)
    def test_json(self, path: bytes, doc: object) -> None:
        """Random JSON documents, including the right containers with wrong contents."""
        self.check(path, json.dumps(doc).encode())
        for wrapped in (
            [doc],
            {"data": [doc]},
            {"models": [doc]},
            {"data": [{"id": "m", "status": doc}]},
            {"models": [{"key": "m", "loaded_instances": [doc]}]},
        ):
            self.check(path, json.dumps(wrapped).encode())
