"""The W3C ``tracestate`` rules (``tracing.tracestate``, spec §9a): what a client's header
must meet to be continued and passed on; anything else is dropped whole."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace.span import TraceState
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.tracing.tracestate import MAX_LENGTH, MAX_MEMBERS, validTracestate

KEY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-*/"
SIMPLE_KEYS = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text(KEY_CHARS, max_size=12),
)
TENANT_KEYS = st.builds(
    lambda tenant, system: f"{tenant}@{system}",
    st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6),
)
NBLK = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in ",="]
VALUES = st.builds(
    lambda body, last: body + last, st.text(NBLK + [" "], max_size=10), st.sampled_from(NBLK)
)
MEMBERS = st.tuples(SIMPLE_KEYS | TENANT_KEYS, VALUES)


def header(members: list[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in members)


class TracestateTests(SynchronousTestCase):
    """``validTracestate`` on examples and generated lists."""

    def test_examples(self) -> None:
        """The standard's examples pass; broken grammar, repeats, 33 members, 513
        characters and non-ASCII are refused."""
        for ok in (
            ["congo=t61rcWkgMzE"],
            ["rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"],
            ["rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE"],
            ["fw529a3039@dt=ZmQ5Yzg", " , vendor=a b "],
            [""],
            [header([(f"k{i}", "v") for i in range(MAX_MEMBERS)])],
        ):
            self.assertTrue(validTracestate(ok), ok)
        for bad in (
            ["no-equals"],
            ["UPPER=x"],
            ["1key=x"],
            ["k=v,k=w"],
            ["k=v", "k=w"],
            ["k="],
            ["k=a=b"],
            ["k=\x9b31m"],
            ["k=caf\xe9"],
            ["k=v;x\x00"],
            [header([(f"k{i}", "v") for i in range(MAX_MEMBERS + 1)])],
            ["a=" + "v" * 254 + ",b=" + "v" * 254],  # 513 characters
            ["a" * 257 + "=v"],
            ["t" * 242 + "@s=v"],
            ["t@" + "s" * 15 + "=v"],
        ):
            self.assertFalse(validTracestate(bad), bad)
        self.assertTrue(validTracestate(["a=" + "v" * 254 + ",b=" + "v" * 253]))  # 512

    @given(st.lists(MEMBERS, max_size=MAX_MEMBERS, unique_by=lambda m: m[0]))
    def test_generatedValid(self, members: list[tuple[str, str]]) -> None:
        """Any list of distinct keys in the grammar within the bounds is valid, and the SDK
        reads it as the same members."""
        text = header(members)
        if len(text) > MAX_LENGTH:
            self.assertFalse(validTracestate([text]))
            return
        self.assertTrue(validTracestate([text]))
        self.assertEqual(list(TraceState.from_header([text]).items()), members)

    @given(st.lists(st.text(max_size=40), max_size=4))
    def test_neverRaises(self, values: list[str]) -> None:
        """Any header lines at all: a verdict, and a valid one has at most 32 members the
        SDK reads without dropping any."""
        if validTracestate(values):
            members = [m for line in values for m in line.split(",") if m.strip(" \t")]
            self.assertLessEqual(len(members), MAX_MEMBERS)
            self.assertEqual(len(TraceState.from_header(values)), len(members))
