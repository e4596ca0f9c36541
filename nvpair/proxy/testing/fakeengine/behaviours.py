"""The script of a fake engine: what it does with each request, and what it saw.

A test queues behaviours (``engine.script(Status(503), Answer())``); each request takes the
next one, or the engine's default when the queue is empty. They are frozen values so that
``Answer`` can key the engine's cache of ready-made answers.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from twisted.internet.defer import Deferred


@attrs.frozen
class Answer:
    """A normal answer in the dialect of the route (streamed when the request asks)."""

    chunks: int = 3
    chunkDelay: float = 0.0
    usage: bool = True
    status: int = 200
    headers: dict[str, str] | None = attrs.field(default=None, eq=False, hash=False)


@attrs.frozen
class Status:
    """Answer this status with this body (JSON content type)."""

    code: int
    body: bytes = b'{"error":"fake engine status"}'
    headers: dict[str, str] | None = attrs.field(default=None, eq=False, hash=False)


@attrs.frozen
class HangAfterHeaders:
    """Send 200 streaming headers (chunked) and then nothing until the connection closes."""


@attrs.frozen
class SlowFirstByte:
    """Send the headers at once and the first body byte after ``delay`` seconds."""

    delay: float
    then: Answer = Answer()


@attrs.frozen
class Hang:
    """Read the request and never answer, not even headers."""


@attrs.frozen
class DieMidStream:
    """Start streaming and abort the TCP connection after ``afterChunks`` chunks."""

    afterChunks: int = 1


@attrs.frozen
class Drop:
    """Abort the connection as soon as the request is read (a transport error)."""


@attrs.frozen
class Echo:
    """Answer 200 with a JSON description of the request (method, path, headers, body)."""


Behaviour = Answer | Status | HangAfterHeaders | SlowFirstByte | Hang | DieMidStream | Drop | Echo


@attrs.define(eq=False)
class Recorded:
    """One request the engine received."""

    method: str
    path: str
    headers: dict[str, list[str]]
    body: bytes
    connectionLost: Deferred[None] = attrs.field(factory=Deferred)

    def json(self) -> Any:
        """Return the body decoded as JSON.

        ``Any`` on purpose: tests reach straight into the document they sent.
        """
        return json.loads(self.body)
