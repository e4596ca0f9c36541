"""A scriptable fake inference engine (Ollama or OpenAI-style) on a raw HTTP/1.1 protocol.

Used in-process by integration tests and standalone by benchmarks::

    python -m tests.fakeengine --port 0 --dialect openai --models a,b [--chunks 50]

which prints one JSON line ``{"port": N}`` on stdout once listening.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IPullProducer,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

CREATED = 1700000000
CREATED_AT = "2024-01-01T00:00:00Z"
PROMPT_TOKENS = 7
EMBEDDING = [0.1, 0.2, 0.3, 0.4]
MAX_HEAD = 65536


def token(i: int) -> str:
    """Return the deterministic content of the i-th streamed chunk."""
    return f"tok{i}"


def content(chunks: int) -> str:
    """Return the full deterministic answer text made of ``chunks`` tokens."""
    return "".join(token(i) for i in range(chunks))


# -- behaviours --------------------------------------------------------------------------


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
        """Return the body decoded as JSON."""
        return json.loads(self.body)


# -- routes ------------------------------------------------------------------------------

# path -> route kind, per dialect (protocol.md §11)
_OPENAI_ROUTES = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completion",
    b"/v1/embeddings": "embedding",
}
_ROUTES: dict[str, dict[bytes, str]] = {
    "ollama": {
        **_OPENAI_ROUTES,
        b"/api/chat": "ochat",
        b"/api/generate": "ogenerate",
        b"/api/embed": "oembed",
        b"/api/embeddings": "oembeddings",
    },
    "openai": {
        **_OPENAI_ROUTES,
        b"/v1/responses": "responses",
        b"/v1/rerank": "rerank",
        b"/api/v0/chat/completions": "chat",
        b"/api/v0/completions": "completion",
        b"/api/v0/embeddings": "embedding",
    },
}
_LISTS: dict[str, dict[bytes, str]] = {
    "ollama": {b"/api/tags": "tags", b"/v1/models": "models"},
    "openai": {b"/v1/models": "models", b"/models": "models", b"/api/v0/models": "models"},
}
_STREAMABLE = {"chat", "completion", "responses", "ochat", "ogenerate"}
_NATIVE = {"ochat", "ogenerate", "oembed", "oembeddings", "tags"}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _streamPieces(kind: str, model: str, answer: Answer, name: str) -> list[bytes]:
    """Return the stream events (unframed) of a streamed answer."""
    n = answer.chunks
    pieces: list[bytes] = []
    if kind in ("chat", "completion"):
        base: dict[str, Any] = {"created": CREATED, "model": model}
        for i in range(n):
            finish = "stop" if i == n - 1 else None
            if kind == "chat":
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": token(i)},
                    "finish_reason": finish,
                }
                ev = {"id": f"chatcmpl-{name}", "object": "chat.completion.chunk", **base}
            else:
                choice = {"index": 0, "text": token(i), "finish_reason": finish, "logprobs": None}
                ev = {"id": f"cmpl-{name}", "object": "text_completion", **base}
            ev["choices"] = [choice]
            pieces.append(b"data: " + _dumps(ev) + b"\n\n")
        if answer.usage:
            obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
            ev = {
                "id": f"chatcmpl-{name}",
                "object": obj,
                **base,
                "choices": [],
                "usage": _usage(n),
            }
            pieces.append(b"data: " + _dumps(ev) + b"\n\n")
        pieces.append(b"data: [DONE]\n\n")
    elif kind == "responses":
        for i in range(n):
            ev = {
                "type": "response.output_text.delta",
                "item_id": f"msg-{name}",
                "output_index": 0,
                "content_index": 0,
                "delta": token(i),
            }
            pieces.append(b"event: response.output_text.delta\ndata: " + _dumps(ev) + b"\n\n")
        ev = {"type": "response.completed", "response": _responsesDoc(model, answer, name)}
        pieces.append(b"event: response.completed\ndata: " + _dumps(ev) + b"\n\n")
    else:  # ochat, ogenerate
        for i in range(n):
            ev = {"model": model, "created_at": CREATED_AT}
            if kind == "ochat":
                ev["message"] = {"role": "assistant", "content": token(i)}
            else:
                ev["response"] = token(i)
            ev["done"] = False
            pieces.append(_dumps(ev) + b"\n")
        last: dict[str, Any] = {"model": model, "created_at": CREATED_AT}
        if kind == "ochat":
            last["message"] = {"role": "assistant", "content": ""}
        else:
            last["response"] = ""
        last.update(done=True, done_reason="stop", **(_ollamaUsage(n) if answer.usage else {}))
        pieces.append(_dumps(last) + b"\n")
    return pieces


def _usage(n: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": n,
        "total_tokens": PROMPT_TOKENS + n,
    }


def _ollamaUsage(n: int) -> dict[str, int]:
    return {
        "total_duration": 1000000 + 1000 * n,
        "load_duration": 1000,
        "prompt_eval_count": PROMPT_TOKENS,
        "prompt_eval_duration": 1000,
        "eval_count": n,
        "eval_duration": 1000 * n,
    }


def _responsesDoc(model: str, answer: Answer, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": f"resp-{name}",
        "object": "response",
        "created_at": CREATED,
        "model": model,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg-{name}",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": content(answer.chunks), "annotations": []}
                ],
            }
        ],
    }
    if answer.usage:
        doc["usage"] = {
            "input_tokens": PROMPT_TOKENS,
            "output_tokens": answer.chunks,
            "total_tokens": PROMPT_TOKENS + answer.chunks,
        }
    return doc


def _document(kind: str, model: str, answer: Answer, name: str, inputs: int) -> bytes:
    """Return the non-streamed JSON document of an answer."""
    n = answer.chunks
    text = content(n)
    doc: dict[str, Any]
    if kind == "chat":
        doc = {
            "id": f"chatcmpl-{name}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
        }
    elif kind == "completion":
        doc = {
            "id": f"cmpl-{name}",
            "object": "text_completion",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        }
    elif kind == "embedding":
        doc = {
            "object": "list",
            "model": model,
            "data": [
                {"object": "embedding", "index": i, "embedding": EMBEDDING} for i in range(inputs)
            ],
        }
        if answer.usage:
            doc["usage"] = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS}
        return _dumps(doc)
    elif kind == "rerank":
        doc = {
            "object": "list",
            "model": model,
            "results": [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(inputs)],
        }
        if answer.usage:
            doc["usage"] = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS}
        return _dumps(doc)
    elif kind == "responses":
        return _dumps(_responsesDoc(model, answer, name))
    elif kind == "oembed":
        doc = {"model": model, "embeddings": [EMBEDDING] * inputs}
        if answer.usage:
            doc.update(total_duration=1000, load_duration=100, prompt_eval_count=PROMPT_TOKENS)
        return _dumps(doc)
    elif kind == "oembeddings":
        return _dumps({"embedding": EMBEDDING})
    else:  # ochat, ogenerate
        doc = {"model": model, "created_at": CREATED_AT}
        if kind == "ochat":
            doc["message"] = {"role": "assistant", "content": text}
        else:
            doc["response"] = text
        doc.update(done=True, done_reason="stop", **(_ollamaUsage(n) if answer.usage else {}))
        return _dumps(doc)
    if answer.usage:
        doc["usage"] = _usage(n)
    return _dumps(doc)


def _streamType(kind: str) -> bytes:
    return b"application/x-ndjson" if kind in _NATIVE else b"text/event-stream"


def _frame(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


# -- the HTTP server protocol --------------------------------------------------------------


@implementer(IPullProducer)
class _AbortWhenFlushed:
    """Abort the transport once everything written so far has left the buffer."""

    def __init__(self, proto: _EngineProtocol) -> None:
        self._proto = proto
        self._calls = 0

    def resumeProducing(self) -> None:
        """Count the drain notifications; the second one means the buffer is empty."""
        self._calls += 1
        if self._calls >= 2:
            tcp = self._proto.tcp()
            tcp.unregisterProducer()
            tcp.abortConnection()

    def stopProducing(self) -> None:
        """Nothing to stop."""


class _EngineProtocol(Protocol):
    """One HTTP/1.1 keep-alive connection to the fake engine."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self._buf = b""
        self._busy = False
        self._parsing = False
        self._keepAlive = True
        self._gone = False
        self._continued = False
        self._lost: list[Deferred[None]] = []
        self._calls: set[IDelayedCall] = set()

    def connectionMade(self) -> None:
        self._engine._connectionMade(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._gone = True
        for call in self._calls:
            if call.active():
                call.cancel()
        self._calls.clear()
        self._engine._connectionLost(self)
        lost, self._lost = self._lost, []
        for d in lost:
            d.callback(None)

    def tcp(self) -> Any:
        """Return the TCP transport of this connection."""
        return self.transport

    def abort(self) -> None:
        """Abort the connection at once."""
        if self.transport is not None and not self._gone:
            self.tcp().abortConnection()

    def later(self, delay: float, f: Callable[[], None]) -> None:
        """Call ``f`` after ``delay`` seconds unless the connection is lost first."""

        def run() -> None:
            self._calls.discard(call)
            if not self._gone:
                f()

        call = self._engine._reactor.callLater(delay, run)
        self._calls.add(call)

    def write(self, data: bytes) -> None:
        """Write bytes to the connection."""
        if not self._gone:
            self.tcp().write(data)

    def dataReceived(self, data: bytes) -> None:
        self._buf += data
        if not self._busy and not self._parsing:
            self._parse()

    def _parse(self) -> None:
        self._parsing = True
        try:
            while not self._busy and not self._gone and self._keepAlive and self._buf:
                if not self._parseOne():
                    return
        finally:
            self._parsing = False

    def _badRequest(self) -> None:
        self._keepAlive = False
        self.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        self.tcp().loseConnection()

    def _parseOne(self) -> bool:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._badRequest()
            return False
        lines = buf[:end].split(b"\r\n")
        try:
            method, target, version = lines[0].split(b" ", 2)
        except ValueError:
            self._badRequest()
            return False
        headers: dict[str, list[str]] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower().decode("latin-1")
            headers.setdefault(key, []).append(value.strip().decode("latin-1"))
        start = end + 4
        te = headers.get("transfer-encoding")
        if te and "chunked" in te[-1].lower():
            parsed = _dechunk(buf, start)
            if parsed is None:
                self._maybeContinue(headers)
                return False
            body, rest = parsed
        else:
            try:
                length = int(headers.get("content-length", ("0",))[0])
            except ValueError:
                self._badRequest()
                return False
            if len(buf) - start < length:
                self._maybeContinue(headers)
                return False
            body, rest = buf[start : start + length], start + length
        self._buf = buf[rest:]
        self._continued = False
        conn = headers.get("connection")
        tokens = ",".join(conn).lower() if conn else ""
        if version == b"HTTP/1.1":
            self._keepAlive = "close" not in tokens
        else:
            self._keepAlive = "keep-alive" in tokens
        self._busy = True
        self._engine._handle(self, method, target, headers, body)
        return True

    def _maybeContinue(self, headers: dict[str, list[str]]) -> None:
        expect = headers.get("expect")
        if expect and not self._continued and expect[0].lower() == "100-continue":
            self._continued = True
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def finished(self) -> None:
        """Mark the current response complete and serve any pipelined request."""
        self._busy = False
        if self._gone:
            return
        if not self._keepAlive:
            self.tcp().loseConnection()
        elif self._buf and not self._parsing:
            self._parse()


def _dechunk(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body from ``buf[pos:]``; None if incomplete."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(buf[pos:eol].split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            # skip trailers up to the empty line
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return b"".join(parts), eol + 2
                pos = eol + 2
        if len(buf) < pos + size + 2:
            return None
        parts.append(buf[pos : pos + size])
        pos += size + 2


class _EngineFactory(Factory):
    """Builds the engine's connection protocols."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def buildProtocol(self, addr: Any) -> _EngineProtocol:
        return _EngineProtocol(self._engine)


# -- the engine --------------------------------------------------------------------------


class FakeEngine:
    """A scriptable fake inference engine speaking the Ollama or OpenAI-style dialect."""

    def __init__(
        self,
        reactor: Any,
        dialect: str = "openai",
        models: Sequence[str] = ("m1",),
        name: str = "engine",
        record: bool = True,
    ) -> None:
        if dialect not in _ROUTES:
            raise ValueError(f"dialect must be 'openai' or 'ollama', not {dialect!r}")
        self._reactor = reactor
        self.dialect = dialect
        self.models: list[str] = list(models)
        self.name = name
        self.record = record
        self.behaviours: list[Behaviour] = []
        self.default: Behaviour = Answer()
        self.listBehaviour: Behaviour | None = None
        self.corsHeaders: dict[str, str] = {}
        self.requests: list[Recorded] = []
        self.requestCount = 0
        self.openConnections = 0
        self.port = 0
        self.url = ""
        self._routes = _ROUTES[dialect]
        self._lists = _LISTS[dialect]
        self._listening: IListeningPort | None = None
        self._protocols: set[_EngineProtocol] = set()
        self._waiters: dict[int, list[Deferred[Recorded]]] = {}
        self._closeWaiters: list[Deferred[None]] = []
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._nameHeader = b"X-Fake-Engine: " + name.encode() + b"\r\n"

    # -- lifecycle --

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Start listening and return the bound port."""
        self._listening = self._reactor.listenTCP(port, _EngineFactory(self), interface=interface)
        self.port = self._listening.getHost().port  # type: ignore[union-attr]
        self.url = f"http://{interface}:{self.port}"
        return self.port

    def stopListening(self) -> Deferred[None]:
        """Stop accepting connections (new ones are refused); open ones stay."""
        listening, self._listening = self._listening, None
        if listening is None:
            return succeed(None)
        result: Deferred[None] = maybeDeferred(listening.stopListening)  # type: ignore[call-overload]
        return result

    def close(self) -> Deferred[None]:
        """Stop listening and abort every open connection; fires when all are gone."""
        waits: list[Deferred[Any]] = [self.stopListening()]
        if self._protocols:
            d: Deferred[None] = Deferred()
            self._closeWaiters.append(d)
            waits.append(d)
            for proto in list(self._protocols):
                proto.abort()
        return DeferredList(waits, fireOnOneErrback=True, consumeErrors=True).addCallback(
            lambda _: None
        )

    def script(self, *behaviours: Behaviour) -> None:
        """Append behaviours for the next requests."""
        self.behaviours.extend(behaviours)

    def waitForRequest(self, n: int) -> Deferred[Recorded]:
        """Return a Deferred firing with the n-th (1-based) recorded request once it arrives."""
        if len(self.requests) >= n:
            return succeed(self.requests[n - 1])
        d: Deferred[Recorded] = Deferred()
        self._waiters.setdefault(n, []).append(d)
        return d

    def _connectionMade(self, proto: _EngineProtocol) -> None:
        self._protocols.add(proto)
        self.openConnections += 1

    def _connectionLost(self, proto: _EngineProtocol) -> None:
        self._protocols.discard(proto)
        self.openConnections -= 1
        if not self._protocols:
            waiters, self._closeWaiters = self._closeWaiters, []
            for d in waiters:
                d.callback(None)

    # -- dispatch --

    def _handle(
        self,
        proto: _EngineProtocol,
        method: bytes,
        target: bytes,
        headers: dict[str, list[str]],
        body: bytes,
    ) -> None:
        self.requestCount += 1
        rec = Recorded(method.decode("latin-1"), target.decode("latin-1"), headers, body)
        if self.record:
            proto._lost.append(rec.connectionLost)
            self.requests.append(rec)
            for d in self._waiters.pop(len(self.requests), ()):
                d.callback(rec)
        path = target.split(b"?", 1)[0]
        if method == b"OPTIONS":
            self._sendDocument(proto, 204, None, None, None)
            return
        listKind = self._lists.get(path) if method == b"GET" else None
        if listKind is not None:
            behaviour = self.listBehaviour
            if behaviour is None or isinstance(behaviour, Answer | Echo):
                self._sendDocument(proto, 200, None, self._listDoc(listKind), b"application/json")
                return
            self._apply(proto, behaviour, "other", rec, "", False, 1)
            return
        behaviour = self.behaviours.pop(0) if self.behaviours else self.default
        kind = self._routes.get(path, "other") if method == b"POST" else "other"
        model = ""
        stream = False
        inputs = 1
        if kind != "other":
            try:
                doc = json.loads(body)
                model = doc["model"]
                if not isinstance(model, str):
                    raise TypeError(model)
            except (ValueError, KeyError, TypeError):
                if not isinstance(behaviour, Answer):
                    kind = "other"
                else:
                    err = b'{"error":"fake engine: body must be a JSON object with a model"}'
                    self._sendDocument(proto, 400, None, err, b"application/json")
                    return
            else:
                if kind in _STREAMABLE:
                    s = doc.get("stream")
                    stream = s is not False if kind in ("ochat", "ogenerate") else s is True
                elif kind in ("oembed", "embedding"):
                    inp = doc.get("input")
                    inputs = len(inp) if isinstance(inp, list) else 1
                elif kind == "rerank":
                    docs = doc.get("documents")
                    inputs = len(docs) if isinstance(docs, list) else 1
        self._apply(proto, behaviour, kind, rec, model, stream, inputs)

    def _apply(
        self,
        proto: _EngineProtocol,
        behaviour: Behaviour,
        kind: str,
        rec: Recorded,
        model: str,
        stream: bool,
        inputs: int,
    ) -> None:
        if isinstance(behaviour, Answer):
            if kind == "other":
                self._sendDocument(
                    proto,
                    behaviour.status,
                    behaviour.headers,
                    self._echoDoc(rec),
                    b"application/json",
                )
            else:
                self._answer(proto, behaviour, kind, model, stream, inputs, 0.0)
        elif isinstance(behaviour, Status):
            self._sendDocument(
                proto, behaviour.code, behaviour.headers, behaviour.body, b"application/json"
            )
        elif isinstance(behaviour, Echo):
            self._sendDocument(proto, 200, None, self._echoDoc(rec), b"application/json")
        elif isinstance(behaviour, HangAfterHeaders):
            proto.write(self._head(200, None, _streamType(kind), None))
        elif isinstance(behaviour, SlowFirstByte):
            if kind == "other":
                head = self._head(200, None, b"application/json", len(self._echoDoc(rec)))
                proto.write(head)
                proto.later(behaviour.delay, lambda: self._finishBody(proto, [self._echoDoc(rec)]))
            else:
                self._answer(proto, behaviour.then, kind, model, stream, inputs, behaviour.delay)
        elif isinstance(behaviour, Hang):
            pass
        elif isinstance(behaviour, Drop):
            proto.abort()
        elif isinstance(behaviour, DieMidStream):
            self._dieMidStream(proto, behaviour, kind, model, rec)
        else:  # pragma: no cover
            raise TypeError(f"unknown behaviour {behaviour!r}")

    # -- responses --

    def _head(
        self,
        status: int,
        extra: dict[str, str] | None,
        contentType: bytes | None,
        length: int | None,
    ) -> bytes:
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

    def _sendDocument(
        self,
        proto: _EngineProtocol,
        status: int,
        extra: dict[str, str] | None,
        body: bytes | None,
        contentType: bytes | None,
    ) -> None:
        payload = b"" if body is None else body
        proto.write(self._head(status, extra, contentType, len(payload)) + payload)
        proto.finished()

    def _finishBody(self, proto: _EngineProtocol, pieces: list[bytes]) -> None:
        proto.write(b"".join(pieces))
        proto.finished()

    def _answer(
        self,
        proto: _EngineProtocol,
        answer: Answer,
        kind: str,
        model: str,
        stream: bool,
        inputs: int,
        firstDelay: float,
    ) -> None:
        cors = tuple(self.corsHeaders.items()) if self.corsHeaders else ()
        extra = tuple(answer.headers.items()) if answer.headers else ()
        key = (kind, model, stream, inputs, answer, extra, cors)
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            if stream:
                pieces = [_frame(p) for p in _streamPieces(kind, model, answer, self.name)]
                pieces.append(b"0\r\n\r\n")
                cached = (
                    self._head(answer.status, answer.headers, _streamType(kind), None),
                    pieces,
                    b"".join(pieces),
                )
            else:
                doc = _document(kind, model, answer, self.name, inputs)
                cached = (
                    self._head(answer.status, answer.headers, b"application/json", len(doc)),
                    [doc],
                    doc,
                )
            self._cache[key] = cached
        head, pieces, whole = cached
        if firstDelay <= 0 and answer.chunkDelay <= 0:
            proto.write(head + whole)
            proto.finished()
            return
        proto.write(head)
        if not stream or answer.chunkDelay <= 0:
            proto.later(firstDelay, lambda: self._finishBody(proto, [whole]))
            return

        def step(i: int) -> None:
            proto.write(pieces[i])
            if i + 1 == len(pieces):
                proto.finished()
            elif i + 2 == len(pieces):  # the terminating zero chunk goes at once
                step(i + 1)
            else:
                proto.later(answer.chunkDelay, lambda: step(i + 1))

        proto.later(firstDelay, lambda: step(0))

    def _dieMidStream(
        self,
        proto: _EngineProtocol,
        behaviour: DieMidStream,
        kind: str,
        model: str,
        rec: Recorded,
    ) -> None:
        n = behaviour.afterChunks
        if kind in _STREAMABLE:
            answer = Answer(chunks=max(n + 1, 3))
            pieces = _streamPieces(kind, model, answer, self.name)[:n]
            ctype = _streamType(kind)
        else:
            whole = (
                self._echoDoc(rec)
                if kind == "other"
                else _document(kind, model, Answer(), self.name, 1)
            )
            size = max(1, len(whole) // (n + 1))
            pieces = [whole[i * size : (i + 1) * size] for i in range(n)]
            ctype = b"application/json"
        proto.write(self._head(200, None, ctype, None) + b"".join(_frame(p) for p in pieces))
        proto.tcp().registerProducer(_AbortWhenFlushed(proto), False)

    def _listDoc(self, kind: str) -> bytes:
        if kind == "tags":
            return _dumps(
                {
                    "models": [
                        {
                            "name": m,
                            "model": m,
                            "modified_at": CREATED_AT,
                            "size": 1,
                            "digest": "0" * 64,
                            "details": {
                                "parent_model": "",
                                "format": "gguf",
                                "family": "fake",
                                "families": ["fake"],
                                "parameter_size": "1B",
                                "quantization_level": "Q4_0",
                            },
                        }
                        for m in self.models
                    ]
                }
            )
        return _dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": CREATED, "owned_by": "fake"}
                    for m in self.models
                ],
            }
        )

    def _echoDoc(self, rec: Recorded) -> bytes:
        return _dumps(
            {
                "engine": self.name,
                "method": rec.method,
                "path": rec.path,
                "headers": rec.headers,
                "bodyLength": len(rec.body),
            }
        )


# -- CLI -----------------------------------------------------------------------------------


def engineFromArgs(reactor: Any, argv: Sequence[str]) -> FakeEngine:
    """Build and start listening a FakeEngine from command-line arguments."""
    parser = argparse.ArgumentParser(prog="python -m tests.fakeengine")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dialect", choices=sorted(_ROUTES), default="openai")
    parser.add_argument("--models", default="m1")
    parser.add_argument("--name", default="engine")
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--record", action="store_true", help="keep every request in memory")
    args = parser.parse_args(list(argv))
    engine = FakeEngine(
        reactor,
        args.dialect,
        [m for m in args.models.split(",") if m],
        name=args.name,
        record=args.record,
    )
    engine.default = Answer(chunks=args.chunks, chunkDelay=args.chunk_delay)
    engine.listen(args.port)
    return engine


def main(argv: Sequence[str] | None = None) -> None:
    """Run a fake engine until killed, printing {"port": N} once listening."""
    from twisted.internet import reactor

    engine = engineFromArgs(reactor, sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps({"port": engine.port}) + "\n")
    sys.stdout.flush()
    reactor.run()


if __name__ == "__main__":
    main()
