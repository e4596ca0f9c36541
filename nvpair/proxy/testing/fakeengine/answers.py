"""How a fake engine carries out a behaviour on a connection: the bytes, and when they go.

Normal answers are built once per distinct request shape and cached, so the engine spends
its time writing rather than encoding JSON when a benchmark drives it hard.
"""

from __future__ import annotations

from http import HTTPStatus

from nvpair.proxy.testing.fakeengine.behaviours import (
    Answer,
    Behaviour,
    DieMidStream,
    Drop,
    Echo,
    Hang,
    HangAfterHeaders,
    Recorded,
    SlowFirstByte,
    Status,
)
from nvpair.proxy.testing.fakeengine.connection import EngineConnection, chunk
from nvpair.proxy.testing.fakeengine.dialects import (
    STREAMABLE,
    Listing,
    Route,
    document,
    dumps,
    listDocument,
    streamPieces,
    streamType,
)

JSON = b"application/json"
_CACHE_LIMIT = 4096

# head, body pieces (one per event when streamed, already framed), whole body
_Ready = tuple[bytes, list[bytes], bytes]


class Responder:
    """Writes the answers of one engine, named ``name`` in ``X-Fake-Engine``.

    ``corsHeaders`` go on every answer.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.corsHeaders: dict[str, str] = {}
        self._nameHeader = b"X-Fake-Engine: " + name.encode() + b"\r\n"
        self._cache: dict[tuple[object, ...], _Ready] = {}

    def apply(
        self,
        connection: EngineConnection,
        behaviour: Behaviour,
        route: Route,
        rec: Recorded,
        model: str,
        stream: bool,
        inputs: int,
    ) -> None:
        """Carry out ``behaviour`` for the request ``rec`` on ``route``."""
        if isinstance(behaviour, Answer):
            if route is Route.OTHER:
                self.sendDocument(
                    connection, behaviour.status, behaviour.headers, self.echoDocument(rec), JSON
                )
            else:
                self._answer(connection, behaviour, route, model, stream, inputs, 0.0)
        elif isinstance(behaviour, Status):
            self.sendDocument(connection, behaviour.code, behaviour.headers, behaviour.body, JSON)
        elif isinstance(behaviour, Echo):
            self.sendDocument(connection, 200, None, self.echoDocument(rec), JSON)
        elif isinstance(behaviour, HangAfterHeaders):
            connection.write(self.head(200, None, streamType(route), None))
        elif isinstance(behaviour, SlowFirstByte):
            if route is Route.OTHER:
                echo = self.echoDocument(rec)
                connection.write(self.head(200, None, JSON, len(echo)))
                connection.later(behaviour.delay, lambda: self._finishBody(connection, echo))
            else:
                then = behaviour.then
                self._answer(connection, then, route, model, stream, inputs, behaviour.delay)
        elif isinstance(behaviour, Hang):
            pass
        elif isinstance(behaviour, Drop):
            connection.abort()
        elif isinstance(behaviour, DieMidStream):
            self._dieMidStream(connection, behaviour, route, model, rec)
        else:  # pragma: no cover
            raise TypeError(f"unknown behaviour {behaviour!r}")

    def head(
        self,
        status: int,
        extra: dict[str, str] | None,
        contentType: bytes | None,
        length: int | None,
    ) -> bytes:
        """The status line and headers; chunked when ``length`` is None."""
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b"Unknown"
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, reason), self._nameHeader]
        if contentType is not None:
            parts.append(b"Content-Type: " + contentType + b"\r\n")
        if length is None:
            if status != 204:
                parts.append(b"Transfer-Encoding: chunked\r\n")
        elif status != 204:
            parts.append(b"Content-Length: %d\r\n" % length)
        for source in (self.corsHeaders, extra):
            if source:
                for k, v in source.items():
                    parts.append(f"{k}: {v}\r\n".encode("latin-1"))
        parts.append(b"\r\n")
        return b"".join(parts)

    def sendDocument(
        self,
        connection: EngineConnection,
        status: int,
        extra: dict[str, str] | None,
        body: bytes | None,
        contentType: bytes | None,
    ) -> None:
        """Answer with one whole body (or none) and finish."""
        payload = b"" if body is None else body
        connection.write(self.head(status, extra, contentType, len(payload)) + payload)
        connection.finished()

    def sendList(self, connection: EngineConnection, listing: Listing, models: list[str]) -> None:
        """Answer 200 with the model list."""
        self.sendDocument(connection, 200, None, listDocument(listing, models), JSON)

    def echoDocument(self, rec: Recorded) -> bytes:
        """A JSON description of the request (without its body, only the body's length)."""
        return dumps(
            {
                "engine": self.name,
                "method": rec.method,
                "path": rec.path,
                "headers": rec.headers,
                "bodyLength": len(rec.body),
            }
        )

    def _finishBody(self, connection: EngineConnection, body: bytes) -> None:
        connection.write(body)
        connection.finished()

    def _ready(self, answer: Answer, route: Route, model: str, stream: bool, inputs: int) -> _Ready:
        cors = tuple(self.corsHeaders.items()) if self.corsHeaders else ()
        extra = tuple(answer.headers.items()) if answer.headers else ()
        key = (route, model, stream, inputs, answer, extra, cors)
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            if stream:
                pieces = [chunk(p) for p in streamPieces(route, model, answer, self.name)]
                pieces.append(b"0\r\n\r\n")
                head = self.head(answer.status, answer.headers, streamType(route), None)
                cached = (head, pieces, b"".join(pieces))
            else:
                doc = document(route, model, answer, self.name, inputs)
                cached = (self.head(answer.status, answer.headers, JSON, len(doc)), [doc], doc)
            self._cache[key] = cached
        return cached

    def _answer(
        self,
        connection: EngineConnection,
        answer: Answer,
        route: Route,
        model: str,
        stream: bool,
        inputs: int,
        firstDelay: float,
    ) -> None:
        head, pieces, whole = self._ready(answer, route, model, stream, inputs)
        if firstDelay <= 0 and answer.chunkDelay <= 0:
            connection.write(head + whole)
            connection.finished()
            return
        connection.write(head)
        if not stream or answer.chunkDelay <= 0:
            connection.later(firstDelay, lambda: self._finishBody(connection, whole))
            return

        def step(i: int) -> None:
            connection.write(pieces[i])
            if i + 1 == len(pieces):
                connection.finished()
            elif i + 2 == len(pieces):  # the terminating zero chunk goes at once
                step(i + 1)
            else:
                connection.later(answer.chunkDelay, lambda: step(i + 1))

        connection.later(firstDelay, lambda: step(0))

    def _dieMidStream(
        self,
        connection: EngineConnection,
        behaviour: DieMidStream,
        route: Route,
        model: str,
        rec: Recorded,
    ) -> None:
        n = behaviour.afterChunks
        if route in STREAMABLE:
            answer = Answer(chunks=max(n + 1, 3))
            pieces = streamPieces(route, model, answer, self.name)[:n]
            contentType = streamType(route)
        else:
            whole = (
                self.echoDocument(rec)
                if route is Route.OTHER
                else document(route, model, Answer(), self.name, 1)
            )
            size = max(1, len(whole) // (n + 1))
            pieces = [whole[i * size : (i + 1) * size] for i in range(n)]
            contentType = JSON
        head = self.head(200, None, contentType, None)
        connection.write(head + b"".join(chunk(p) for p in pieces))
        connection.abortWhenFlushed()
