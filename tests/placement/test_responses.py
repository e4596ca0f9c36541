"""Stored Responses answers (spec §11 "Stored responses", issue 30 point 3): the bounded,
aged id table, the follow-up rule, and the sniffer that finds an answer's id."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.responses import (
    MAX_ID,
    NOT_FOUND_CODE,
    SNIFF_LIMIT,
    FollowUp,
    Predecessor,
    ResponseIdSniffer,
    ResponseTable,
    followUp,
    notFoundBody,
)

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=60).map(
    lambda s: "resp_" + s
)
texts = st.text(max_size=200)


def jsonAnswer(responseId: str, text: str, order: int) -> bytes:
    """A non-streamed answer: OpenAI's order (id first) or llama.cpp's (sorted keys)."""
    doc = {
        "id": responseId,
        "object": "response",
        "created_at": 1,
        "model": "m",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
        "status": "completed",
    }
    return json.dumps(doc, sort_keys=order == 1, ensure_ascii=order == 2).encode()


def streamAnswer(responseId: str, text: str, named: bool, crlf: bool) -> bytes:
    """A streamed answer: ``response.created`` first (with or without ``event:`` lines,
    after a comment), then deltas."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": responseId, "object": "response"}},
        {"type": "response.output_text.delta", "delta": text},
        {"type": "response.completed", "response": {"id": responseId, "status": "completed"}},
    ]
    out = b": keep-alive\n\n"
    for event in events:
        if named:
            out += b"event: " + str(event["type"]).encode() + b"\n"
        out += b"data: " + json.dumps(event).encode() + b"\n\n"
    return out.replace(b"\n", b"\r\n") if crlf else out


def sniffChunks(data: bytes, cuts: list[int]) -> tuple[list[str], ResponseIdSniffer]:
    """Feed ``data`` cut at ``cuts``, then finish; every id the sniffer gave."""
    sniffer = ResponseIdSniffer()
    given_: list[str] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        found = sniffer.feed(data[start:cut])
        if found is not None:
            given_.append(found)
        start = max(start, cut)
    found = sniffer.finish()
    if found is not None:
        given_.append(found)
    return given_, sniffer


class TableTests(SynchronousTestCase):
    """The table is bounded in entries, in age and in id length."""

    def test_recordAndAge(self) -> None:
        """An id is known until it is older than the age cap."""
        clock = Clock()
        table = ResponseTable(clock, maxEntries=10, maxAge=60)
        table.record("resp_1", "A")
        clock.advance(59)
        self.assertEqual(table.nodeOf("resp_1"), "A")
        clock.advance(2)
        self.assertIsNone(table.nodeOf("resp_1"))
        table.record("resp_2", "B")
        self.assertEqual(len(table), 1, "the expired entry was pruned")

    def test_entriesCapped(self) -> None:
        """Beyond the cap the oldest ids go; the size never exceeds it."""
        table = ResponseTable(Clock(), maxEntries=100)
        for n in range(5000):
            table.record(f"resp_{n}", "A")
            self.assertLessEqual(len(table), 100)
        self.assertIsNone(table.nodeOf("resp_4899"))
        self.assertEqual(table.nodeOf("resp_4900"), "A")

    def test_idsBounded(self) -> None:
        """An empty id or one longer than ``MAX_ID`` is not kept."""
        table = ResponseTable(Clock())
        table.record("", "A")
        table.record("r" * (MAX_ID + 1), "A")
        table.record("r" * MAX_ID, "B")
        self.assertEqual(len(table), 1)
        self.assertEqual(table.nodeOf("r" * MAX_ID), "B")


class FollowUpTests(SynchronousTestCase):
    """Where a follow-up goes (``followUp``)."""

    def test_rule(self) -> None:
        """No predecessor or an unknown one: placed as usual; a known one on an owner: that
        node; on a node that no longer owns the model: gone."""
        table = ResponseTable(Clock())
        table.record("resp_1", "A")
        self.assertEqual(followUp(table, None, {"A", "B"}), FollowUp(Predecessor.NONE))
        self.assertEqual(followUp(table, "resp_9", {"A"}), FollowUp(Predecessor.NONE))
        self.assertEqual(followUp(table, "resp_1", {"A", "B"}), FollowUp(Predecessor.STORED, "A"))
        self.assertEqual(followUp(table, "resp_1", {"B"}), FollowUp(Predecessor.GONE))

    def test_notFoundShape(self) -> None:
        """The answer for a gone predecessor is OpenAI's error shape with its code."""
        doc = json.loads(notFoundBody())
        self.assertEqual(doc["error"]["code"], NOT_FOUND_CODE)
        self.assertEqual(doc["error"]["type"], "invalid_request_error")
        self.assertEqual(doc["error"]["param"], "previous_response_id")


class SnifferTests(SynchronousTestCase):
    """The sniffer finds the id however the answer is cut, and nothing in garbage."""

    @PROPERTY
    @given(ids, texts, st.integers(0, 2), st.lists(st.integers(0, 2000), max_size=30))
    def test_jsonAnyChunking(self, responseId: str, text: str, order: int, cuts: list[int]) -> None:
        """A JSON answer cut anywhere gives its id exactly once."""
        found, sniffer = sniffChunks(jsonAnswer(responseId, text, order), cuts)
        self.assertEqual(found, [responseId])
        self.assertTrue(sniffer.done)

    @PROPERTY
    @given(ids, texts, st.booleans(), st.booleans(), st.lists(st.integers(0, 2000), max_size=30))
    def test_streamAnyChunking(
        self, responseId: str, text: str, named: bool, crlf: bool, cuts: list[int]
    ) -> None:
        """A stream cut anywhere gives the first event's id exactly once."""
        found, _ = sniffChunks(streamAnswer(responseId, text, named, crlf), cuts)
        self.assertEqual(found, [responseId])

    @PROPERTY
    @given(st.binary(max_size=3000), st.lists(st.integers(0, 3000), max_size=20))
    def test_garbageFindsNone(self, data: bytes, cuts: list[int]) -> None:
        """Arbitrary bytes: no id (they hold no ``"id"`` string member), no error."""
        found, sniffer = sniffChunks(
            data.replace(b'"id"', b'"ix"').replace(b"response.", b""), cuts
        )
        self.assertEqual(found, [])
        self.assertTrue(sniffer.done)

    def test_otherAnswersFindNone(self) -> None:
        """An error document, a chat answer stream, a non-string id: no id."""
        for data in (
            b'{"error": {"id": "resp_x", "message": "no"}}',
            b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk"}\n\n',
            b'{"id": 5, "object": "response"}',
            b'event: error\ndata: {"type": "error", "response": {"id": "resp_x"}}\n\n',
        ):
            self.assertEqual(sniffChunks(data, [3, 10])[0], [], data)

    def test_givesUpAtTheLimit(self) -> None:
        """An id past ``SNIFF_LIMIT`` bytes is never found, and the sniffer holds at most
        the limit, then nothing."""
        late = b'{"output": "' + b"x" * SNIFF_LIMIT + b'", "id": "resp_late"}'
        sniffer = ResponseIdSniffer()
        for start in range(0, len(late), 1000):
            self.assertIsNone(sniffer.feed(late[start : start + 1000]))
        self.assertTrue(sniffer.done)
        self.assertIsNone(sniffer.finish())
        self.assertIsNone(sniffer.responseId)

    def test_overlongIdNotGiven(self) -> None:
        """An id longer than ``MAX_ID`` is not given."""
        data = json.dumps({"id": "r" * (MAX_ID + 1)}).encode()
        self.assertEqual(sniffChunks(data, [])[0], [])
