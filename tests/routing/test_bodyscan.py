"""The bounded scan of large bodies (spec §5 "Bodies", ``routing/bodyscan.py``): wherever it
answers it agrees with ``json.loads``, and it never fails on cut, garbled or hostile bytes."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.bodyscan import WINDOW, leadingMembers, scanMembers

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Strings full of what a scanner could trip on: quotes, backslashes, brackets, commas,
# colons, blanks, multi-byte characters (window edges fall inside them).
tricky = st.text(alphabet=st.sampled_from('ab"\\,:{}[] \n\té日😀'), max_size=12)
texts = tricky | st.text(max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(
    st.sampled_from(["model", "stream", "user", "messages", "x", 'a"b', "mo\\del"]) | texts,
    values,
    max_size=8,
)


def serialize(doc: dict[str, object], style: int) -> bytes:
    """``doc`` as JSON in one of several spellings clients use."""
    if style == 0:
        return json.dumps(doc).encode()
    if style == 1:
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    if style == 2:
        return json.dumps(doc, ensure_ascii=False, indent=1).encode()
    return b" \r\n" + json.dumps(doc, separators=(" , ", " : ")).encode() + b"\n\t "


class AgreementTests(SynchronousTestCase):
    """On valid JSON objects the scan reports only what ``json.loads`` says."""

    @PROPERTY
    @given(objects, st.integers(0, 3), st.data())
    def test_agreesWithJsonLoads(
        self, doc: dict[str, object], style: int, data: st.DataObject
    ) -> None:
        """Any window: every member found has ``json.loads``'s value; a window holding the
        whole body finds every member asked for."""
        body = serialize(doc, style)
        window = data.draw(st.integers(1, len(body) + 8), "window")
        names = set(doc) | {"absent"}
        found = scanMembers(body, names, window)
        assert found is not None
        parsed = json.loads(body)
        for name, value in found.items():
            self.assertEqual(value, parsed[name], name)
        if window >= len(body):
            self.assertEqual(found, parsed)

    @PROPERTY
    @given(objects, values, values, st.integers(0, 3), st.integers(1, 4000))
    def test_endsFoundPastAHugeMiddle(
        self, doc: dict[str, object], first: object, last: object, style: int, size: int
    ) -> None:
        """A member before and a member after a middle far larger than the window are
        found, whatever the middle holds."""
        middle = {"messages": [{"role": "user", "content": 'x", "last": 1}\\' * size}]}
        rest = {k: v for k, v in doc.items() if k not in ("first", "messages", "last")}
        whole = {"first": first, **middle, **rest, "last": last}
        body = serialize(whole, style)
        found = scanMembers(body, {"first", "last", "messages"}, 64)
        assert found is not None
        self.assertNotIn("messages", found)
        if len(serialize({"first": first}, style)) < 48:
            self.assertEqual(found.get("first"), first)
        if len(serialize({"last": last}, style)) < 48:
            self.assertEqual(found.get("last"), last)

    def test_duplicatesLastWins(self) -> None:
        """A name given twice counts at its later place, as with ``json.loads``."""
        body = b'{"model": "a", "x": "' + b"y" * 1000 + b'", "model": "b"}'
        self.assertEqual(scanMembers(body, {"model"}, 100), {"model": "b"})
        self.assertEqual(scanMembers(body, {"model"}, 5000), {"model": "b"})

    def test_nestedNeverTopLevel(self) -> None:
        """A member of a nested object, or text that looks like one inside a string, is
        never taken for a top-level member, at either end."""
        inner = b'{"x": {"model": "inner"}, "s": "\\", \\"model\\": \\"str\\"}"'
        for window in (8, 30, 64, 10_000):
            self.assertEqual(scanMembers(inner + b"}", {"model"}, window), {})
        tail = b'{"p": "' + b"z" * 500 + b'", "q": [{"model": "nested"}], "model": "top"}'
        self.assertEqual(scanMembers(tail, {"model"}, 60), {"model": "top"})


class HostileTests(SynchronousTestCase):
    """Cut, garbled, deep and huge bodies: the scan ends, finds nothing wrong, raises
    nothing."""

    @PROPERTY
    @given(objects, st.integers(0, 3), st.data())
    def test_cutBodies(self, doc: dict[str, object], style: int, data: st.DataObject) -> None:
        """A valid body cut anywhere, or with one byte changed: no exception, a mapping
        or None."""
        body = serialize(doc, style)
        cut = data.draw(st.integers(0, len(body)), "cut")
        flip = data.draw(st.integers(0, max(0, len(body) - 1)), "flip")
        byte = data.draw(st.integers(0, 255), "byte")
        garbled = body[:flip] + bytes([byte]) + body[flip + 1 :]
        window = data.draw(st.integers(1, len(body) + 8), "window")
        for candidate in (body[:cut], garbled):
            found = scanMembers(candidate, {"model", "x", "user"}, window)
            self.assertTrue(found is None or isinstance(found, dict))

    @PROPERTY
    @given(st.binary(max_size=400), st.integers(1, 500))
    def test_arbitraryBytes(self, body: bytes, window: int) -> None:
        """Any bytes: a mapping or None, never an exception."""
        found = scanMembers(body, {"model"}, window)
        self.assertTrue(found is None or isinstance(found, dict))
        self.assertTrue(leadingMembers(body, {"model"}) is None or found is not None)

    def test_deepNesting(self) -> None:
        """Nesting far past the interpreter's recursion limit, at either end or between
        them, does not stop the members around it from being found."""
        deep = b"[" * 200_000 + b"]" * 200_000
        body = b'{"model": "m", "x": ' + deep + b', "user": "u"}'
        self.assertEqual(scanMembers(body, {"model", "user"}), {"model": "m", "user": "u"})
        cut = b'{"x": ' + b"[" * 300_000
        self.assertEqual(scanMembers(cut, {"model"}), {})
        whole = b'{"x": ' + deep + b"}"
        self.assertEqual(scanMembers(whole, {"model"}, len(whole)), {})

    def test_hugeStrings(self) -> None:
        """A string of megabytes with escapes and quotes inside, and backslash runs across
        the window's edges, hides nothing and invents nothing."""
        text = '\\"model\\": \\"fake\\", ' * 100_000 + "\\\\" * 1001
        body = ('{"model": "m", "messages": "' + text + '", "stream": true}').encode()
        self.assertEqual(scanMembers(body, {"model", "stream"}), {"model": "m", "stream": True})
        for edge in range(1, 40):
            found = scanMembers(body, {"model", "stream"}, WINDOW + edge)
            self.assertEqual(found, {"model": "m", "stream": True})

    def test_notAnObject(self) -> None:
        """An array, a string, an empty body: None; an empty object: nothing."""
        for body in (b"", b"[]", b'"{"', b"  [1, 2]", b"\xef\xbb\xbf{}"):
            self.assertIsNone(scanMembers(body, {"model"}), body)
        self.assertEqual(scanMembers(b" { } ", {"model"}), {})

    def test_invalidUtf8(self) -> None:
        """A window that is not UTF-8 finds nothing there."""
        body = b'{"model": "\xff\xfe", "user": "u"}'
        self.assertEqual(scanMembers(body, {"model", "user"}), {})


class LeadingTests(SynchronousTestCase):
    """``leadingMembers`` reads the complete members of the start of an object."""

    @PROPERTY
    @given(objects, st.integers(0, 3), st.data())
    def test_prefixes(self, doc: dict[str, object], style: int, data: st.DataObject) -> None:
        """Every prefix of a body yields only members ``json.loads`` agrees with, and the
        whole body yields them all."""
        body = serialize(doc, style)
        cut = data.draw(st.integers(0, len(body)), "cut")
        found = leadingMembers(body[:cut], set(doc))
        parsed = json.loads(body)
        for name, value in (found or {}).items():
            self.assertEqual(value, parsed[name])
        self.assertEqual(leadingMembers(body, set(doc)), parsed)
