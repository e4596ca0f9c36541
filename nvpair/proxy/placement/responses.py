"""Which node stored which OpenAI Responses answer (spec §11 "Stored responses").

A follow-up on ``/v1/responses`` names its predecessor (``previous_response_id``), a
response one engine stored (LM Studio keeps them; Ollama and llama.cpp store none).  Its
``input`` holds only the new turn, so its place is its predecessor's node, not a fresh
prefix match.  The proxy learns each response's id from the first bytes of the committed
answer (``ResponseIdSniffer``: the JSON answer's top-level ``id``, or the stream's first
``response.*`` event's ``response.id``) and keeps it against the node that served it
(``ResponseTable``, bounded in entries, in age and in id length, like the affinity table);
``followUp`` says where a follow-up goes.  Pure: no reactor, the clock is passed in.
"""

from __future__ import annotations

import json
from enum import Enum

import attrs

from nvpair.proxy.placement.agedtable import AgedTable
from nvpair.proxy.routing.bodyscan import leadingMembers

__all__ = [
    "MAX_ID",
    "NOT_FOUND_CODE",
    "NOT_FOUND_STATUS",
    "SNIFF_LIMIT",
    "FollowUp",
    "Predecessor",
    "ResponseIdSniffer",
    "ResponseTable",
    "followUp",
    "notFoundBody",
]

MAX_ID = 128  # characters of a response id the table keeps (longer ones: not kept)
SNIFF_LIMIT = 16 * 1024  # bytes of an answer read for its id, at most
FIRST_TRY = 256  # bytes buffered before the first attempt to read the id
NOT_FOUND_STATUS = 404
NOT_FOUND_CODE = "previous_response_not_found"


def _usable(responseId: object) -> bool:
    return type(responseId) is str and 0 < len(responseId) <= MAX_ID


class ResponseTable(AgedTable[str]):
    """Response id to the node that served (and so stored) it (``agedtable.AgedTable``)."""

    def record(self, key: str, nodeId: str) -> None:
        """``nodeId`` served the response ``key`` now (an id longer than ``MAX_ID`` is not
        kept); the oldest entries beyond the caps go."""
        if _usable(key):
            super().record(key, nodeId)

    def nodeOf(self, responseId: str) -> str | None:
        """The node that served ``responseId``, if known and not too old."""
        return self.lookup((responseId,))


class Predecessor(Enum):
    """What is known of a request's ``previous_response_id``."""

    NONE = "none"  # no predecessor, or one the proxy never saw served: placed as usual
    STORED = "stored"  # served by a node that still owns the model: sent there only
    GONE = "gone"  # served by a node that no longer does: 404 ``previous_response_not_found``


@attrs.frozen
class FollowUp:
    """Where a request goes by its predecessor: ``node`` is set when ``STORED``."""

    predecessor: Predecessor
    node: str | None = None


_NEW = FollowUp(Predecessor.NONE)


def followUp(table: ResponseTable, previousResponseId: str | None, owners: set[str]) -> FollowUp:
    """Where a request naming ``previousResponseId`` goes, among the node ids ``owners`` of
    its model: its predecessor's node when that is one of them, ``GONE`` when the node
    that stored it is not (no other node can know the id), else placed as usual."""
    if previousResponseId is None:
        return _NEW
    nodeId = table.nodeOf(previousResponseId)
    if nodeId is None:
        return _NEW
    if nodeId in owners:
        return FollowUp(Predecessor.STORED, nodeId)
    return FollowUp(Predecessor.GONE)


def notFoundBody() -> bytes:
    """The OpenAI-shaped error the proxy answers a follow-up whose predecessor's node is
    gone with (status ``NOT_FOUND_STATUS``); it does not repeat the id."""
    error = {
        "message": "Previous response not found: the node that stored it is gone.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": NOT_FOUND_CODE,
    }
    return json.dumps({"error": error}).encode("utf-8")


class ResponseIdSniffer:
    """Finds a Responses answer's id in its first ``SNIFF_LIMIT`` bytes, fed as they come:
    a JSON answer's top-level ``id``, or the ``response.id`` of a stream's first
    ``response.*`` event.  Each byte is copied once, into a buffer of at most the limit;
    the buffer is read each time it has doubled (from ``FIRST_TRY`` bytes), once when a
    chunk first ends an event (a blank line: the first event, which names the response, is
    whole then), when it reaches the limit and at ``finish``, so all the reads together
    cover under three times the limit, whatever the chunking."""

    __slots__ = ("limit", "responseId", "done", "_buffer", "_nextTry", "_eventTried")

    def __init__(self, limit: int = SNIFF_LIMIT) -> None:
        self.limit = limit
        self.responseId: str | None = None
        self.done = False  # found, or given up: later bytes are not looked at
        self._buffer = bytearray()
        self._nextTry = min(FIRST_TRY, limit)
        self._eventTried = False  # read once at the first chunk ending an event

    def feed(self, data: bytes) -> str | None:
        """Take the next bytes of the answer; the id once found (then None again)."""
        if self.done:
            return None
        buffer = self._buffer
        buffer += data[: self.limit - len(buffer)]
        if len(buffer) < self._nextTry:
            if self._eventTried or b"\n\n" not in data:
                return None  # neither doubled nor the first event's end: read later
            self._eventTried = True
        self._nextTry = min(2 * len(buffer), self.limit)
        return self._read(final=len(buffer) >= self.limit)

    def finish(self) -> str | None:
        """The answer ended: the id, if the bytes read hold one and it was not given yet."""
        if self.done:
            return None
        return self._read(final=True)

    def _read(self, final: bool) -> str | None:
        found = _idIn(bytes(self._buffer))
        if found is not None or final:
            self.done = True
            self._buffer = bytearray()
            self.responseId = found if _usable(found) else None
            return self.responseId
        return None


def _idIn(data: bytes) -> str | None:
    """The response id in the first bytes of an answer, if they hold one."""
    start = data.lstrip()[:1]
    if start == b"{":
        members = leadingMembers(data, ("id",))
        value = None if members is None else members.get("id")
        return value if type(value) is str else None
    return _streamedId(data)


def _streamedId(data: bytes) -> str | None:
    """The ``response.id`` of the first complete event of a server-sent event stream."""
    text = data.replace(b"\r\n", b"\n")
    end = text.find(b"\n\n")
    while end >= 0:
        event, text = text[:end], text[end + 2 :]
        lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            return _eventId(b"\n".join(lines))
        end = text.find(b"\n\n")  # a comment or an event with no data: the next one
    return None


def _eventId(data: bytes) -> str | None:
    """The ``response.id`` of one event's data, when it is a ``response.*`` event."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    kind, response = doc.get("type"), doc.get("response")
    if type(kind) is not str or not kind.startswith("response.") or type(response) is not dict:
        return None
    value = response.get("id")
    return value if type(value) is str else None
