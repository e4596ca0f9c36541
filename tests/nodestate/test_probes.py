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
    parseProbe,
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
        self.assertEqual(ENGINES["lmstudio"].stateProbes, (b"/api/v0/models",))
        self.assertEqual(ENGINES["ollama"].stateProbes, (b"/api/ps",))
        for engine in ENGINES.values():
            for path in engine.stateProbes:
                self.assertIn(path, PARSERS)

    def test_wrongShapes(self) -> None:
        """Wrong types, missing fields, an empty slot list, a huge body: refused."""
        bad = {
            b"/slots": [b"[]", b"{}", b'[{"id": 0}]', b'[{"is_processing": "yes"}]', b"[1]"],
            b"/metrics": [b"", b"llamacpp:requests_processing NaN", b"other 1"],
            b"/api/v0/models": [b"[]", b'{"data": [{"id": 1, "state": "loaded"}]}'],
            b"/api/ps": [b'{"models": {}}', b'{"models": [{"name": 3}]}', b"null"],
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
        for wrapped in ([doc], {"data": [doc]}, {"models": [doc]}):
            self.check(path, json.dumps(wrapped).encode())
