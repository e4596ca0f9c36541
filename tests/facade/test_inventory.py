"""Tests for nvpair.proxy.facade.inventory: model-list parsing and the fleet merge."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.inventory import (
    InvalidList,
    emptyEnvelope,
    listKey,
    mergeLists,
    modelNames,
    parseList,
)

OPENAI_PATHS = ["/v1/models", "/api/v0/models", "/models"]


def openaiList(*ids: str, owner: str = "n") -> bytes:
    """An OpenAI-style model list body."""
    return json.dumps(
        {"object": "list", "data": [{"id": i, "object": "model", "owned_by": owner} for i in ids]}
    ).encode()


def tagsList(*names: str, size: int = 1) -> bytes:
    """An Ollama /api/tags body."""
    return json.dumps({"models": [{"name": n, "model": n, "size": size} for n in names]}).encode()


class KeyTests(SynchronousTestCase):
    """listKey."""

    def test_keys(self) -> None:
        """/api/tags lists models by name; every other route lists data by id."""
        self.assertEqual(listKey("/api/tags"), ("models", "name"))
        self.assertEqual(listKey("/api/tags?x=1"), ("models", "name"))
        for path in OPENAI_PATHS:
            self.assertEqual(listKey(path), ("data", "id"))


class ParseTests(SynchronousTestCase):
    """parseList and modelNames."""

    def test_openai(self) -> None:
        """An OpenAI-style list yields its entries and ids."""
        body = openaiList("a", "b")
        self.assertEqual([e["id"] for e in parseList("/v1/models", body)], ["a", "b"])
        self.assertEqual(modelNames("/api/v0/models", body), ["a", "b"])

    def test_tags(self) -> None:
        """An Ollama tags list yields its names."""
        self.assertEqual(
            modelNames("/api/tags", tagsList("llama3:latest", "qwen:7b")),
            ["llama3:latest", "qwen:7b"],
        )

    def test_llamacppModelsParsesData(self) -> None:
        """llama.cpp's /models answer with both models and data is read by data."""
        body = json.dumps(
            {
                "models": [{"name": "ignored.gguf", "model": "ignored.gguf"}],
                "object": "list",
                "data": [{"id": "qwen.gguf", "object": "model"}],
            }
        ).encode()
        self.assertEqual(modelNames("/models", body), ["qwen.gguf"])
        self.assertEqual(modelNames("/v1/models", body), ["qwen.gguf"])

    def test_invalid(self) -> None:
        """Bodies that are not the envelope, or entries without a string id, raise."""
        bad = [
            b"",
            b"not json",
            b"\xff\xfe\x00",
            b"[]",
            b'"list"',
            b'{"object": "list"}',
            b'{"data": {}}',
            b'{"data": [1]}',
            b'{"data": [{"name": "a"}]}',
            b'{"data": [{"id": 5}]}',
            b'{"data": [{"id": null}]}',
            b"[" * 100000,
        ]
        for body in bad:
            self.assertRaises(InvalidList, parseList, "/v1/models", body)
            self.assertRaises(InvalidList, modelNames, "/v1/models", body)
        self.assertRaises(InvalidList, parseList, "/api/tags", openaiList("a"))
        self.assertRaises(InvalidList, parseList, "/v1/models", tagsList("a"))

    def test_invalidIsValueError(self) -> None:
        """InvalidList is a ValueError."""
        self.assertTrue(issubclass(InvalidList, ValueError))

    def test_emptyList(self) -> None:
        """An empty list is valid."""
        self.assertEqual(parseList("/v1/models", b'{"object":"list","data":[]}'), [])


class MergeTests(SynchronousTestCase):
    """mergeLists and emptyEnvelope."""

    def test_duplicatesFirstWins(self) -> None:
        """Duplicates across nodes keep the first node's entry; order is preserved."""
        merged = json.loads(
            mergeLists(
                "/v1/models",
                [
                    openaiList("a", "b", owner="n1"),
                    openaiList("b", "c", "a", owner="n2"),
                    openaiList("d", "c", owner="n3"),
                ],
            )
        )
        self.assertEqual(merged["object"], "list")
        self.assertEqual(
            [(e["id"], e["owned_by"]) for e in merged["data"]],
            [("a", "n1"), ("b", "n1"), ("c", "n2"), ("d", "n3")],
        )

    def test_tagsMergeByName(self) -> None:
        """/api/tags merges by name into the {"models": [...]} envelope."""
        merged = json.loads(
            mergeLists("/api/tags", [tagsList("x:1", size=1), tagsList("y:1", "x:1", size=2)])
        )
        self.assertEqual(
            merged,
            {
                "models": [
                    {"name": "x:1", "model": "x:1", "size": 1},
                    {"name": "y:1", "model": "y:1", "size": 2},
                ]
            },
        )

    def test_invalidBodyRaises(self) -> None:
        """One invalid body anywhere fails the whole merge."""
        self.assertRaises(
            InvalidList, mergeLists, "/v1/models", [openaiList("a"), b"<html>", openaiList("b")]
        )
        self.assertRaises(
            InvalidList, mergeLists, "/v1/models", [openaiList("a"), b'{"data": [{"id": "b"}, {}]}']
        )

    def test_emptyEnvelopes(self) -> None:
        """The empty fleet answers the engine's empty envelope, as does merging nothing."""
        self.assertEqual(json.loads(emptyEnvelope("/api/tags")), {"models": []})
        for path in OPENAI_PATHS:
            self.assertEqual(json.loads(emptyEnvelope(path)), {"object": "list", "data": []})
            self.assertEqual(mergeLists(path, []), emptyEnvelope(path))

    def test_unicodeKept(self) -> None:
        """Non-ASCII ids survive the merge as UTF-8."""
        merged = mergeLists("/v1/models", [openaiList("modèle")])
        self.assertIn("modèle".encode(), merged)

    @given(st.lists(st.lists(st.sampled_from("abcdef"), max_size=6), max_size=5))
    def test_mergeProperty(self, nodes: list[list[str]]) -> None:
        """The merge lists each id once, in first-seen order, from the first node naming it."""
        bodies = [openaiList(*ids, owner=str(n)) for n, ids in enumerate(nodes)]
        merged = json.loads(mergeLists("/v1/models", bodies))["data"]
        expected: dict[str, str] = {}
        for n, ids in enumerate(nodes):
            for i in ids:
                expected.setdefault(i, str(n))
        self.assertEqual([(e["id"], e["owned_by"]) for e in merged], list(expected.items()))
