"""Tests for routing.nodes: validating the ``discovery:nodes`` node list."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.nodes import Node, parseNodes


class ParseNodesTests(SynchronousTestCase):
    """``parseNodes`` validates the ``discovery:nodes`` node list."""

    def test_good(self) -> None:
        """Well-formed entries parse; unknown fields are ignored; self/addresses default."""
        parsed = parseNodes(
            [
                {
                    "id": "n1",
                    "self": True,
                    "addresses": ["10.0.0.1:11434", "http://h:1"],
                    "models": ["llama3", "qwen:7b"],
                    "colour": "blue",
                },
                {"id": "n2", "models": []},
            ]
        )
        self.assertEqual(
            parsed,
            (
                Node(
                    "n1", True, ("10.0.0.1:11434", "http://h:1"), frozenset({"llama3", "qwen:7b"})
                ),
                Node("n2", False, (), frozenset()),
            ),
        )

    def test_paramsObject(self) -> None:
        """The whole params object ``{nodes: [...]}`` is accepted too."""
        self.assertEqual(
            parseNodes({"nodes": [{"id": "a", "models": ["m"]}]}),
            (Node("a", False, (), frozenset({"m"})),),
        )
        self.assertEqual(parseNodes({"nodes": []}), ())

    def test_duplicateKeepsFirst(self) -> None:
        """A repeated id keeps the first entry."""
        parsed = parseNodes([{"id": "a", "models": ["x"]}, {"id": "a", "models": ["y"]}])
        self.assertEqual(parsed, (Node("a", False, (), frozenset({"x"})),))

    def test_bad(self) -> None:
        """Each wrong shape raises ValueError naming the field without echoing values."""
        cases: list[tuple[object, str]] = [
            ("secret", "nodes"),
            ({"other": 1}, "nodes"),
            ({"nodes": "secret"}, "nodes"),
            (["secret"], "nodes[0]"),
            ([{"models": []}], "nodes[0].id"),
            ([{"id": "", "models": []}], "nodes[0].id"),
            ([{"id": 5, "models": []}], "nodes[0].id"),
            (
                [{"id": "a", "models": []}, {"id": "b", "self": "secret", "models": []}],
                "nodes[1].self",
            ),
            ([{"id": "a", "self": 1, "models": []}], "nodes[0].self"),
            ([{"id": "a", "addresses": "secret", "models": []}], "nodes[0].addresses"),
            ([{"id": "a", "addresses": [1], "models": []}], "nodes[0].addresses"),
            ([{"id": "a"}], "nodes[0].models"),
            ([{"id": "a", "models": "secret"}], "nodes[0].models"),
            ([{"id": "a", "models": ["ok", None]}], "nodes[0].models"),
        ]
        for raw, field in cases:
            with self.assertRaises(ValueError, msg=repr(raw)) as caught:
                parseNodes(raw)
            message = str(caught.exception)
            self.assertIn(field, message)
            self.assertNotIn("secret", message)
