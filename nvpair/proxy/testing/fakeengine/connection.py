"""The fake engine's HTTP/1.1 server connection: a small raw parser, not twisted.web.

A raw protocol keeps the engine's faults exact (a connection can hang after the headers, die
after the n-th chunk, or be aborted before any byte) and keeps it fast enough to stand in for
an engine in benchmarks. It parses requests (Content-Length or chunked bodies, ``Expect:
100-continue``, keep-alive and pipelining) and hands each one to an ``IRequestHandler``,
which answers through the connection's methods and calls ``finished`` when done.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IAddress,
    IConsumer,
    IDelayedCall,
    IPullProducer,
    IReactorTime,
    ITCPTransport,
)
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

MAX_HEAD = 65536


class IRequestHandler(Interface):
    """What answers the requests of engine connections (the ``FakeEngine``)."""

    def connectionOpened(connection: EngineConnection) -> None:
        """A client connected."""

    def connectionClosed(connection: EngineConnection) -> None:
        """A connection is gone (closed by either side or aborted)."""

    def requestReceived(
        connection: EngineConnection,
        method: bytes,
        target: bytes,
        headers: dict[str, list[str]],
        body: bytes,
    ) -> None:
        """Answer one complete request; call ``connection.finished()`` once answered.

        ``headers`` maps lower-cased names to their values in order.
        """


class ConnectionState(enum.Enum):
    """Where a connection is: reading requests, answering one, or gone."""

    READING = "reading"
    ANSWERING = "answering"
    CLOSED = "closed"


def chunk(piece: bytes) -> bytes:
    """Frame ``piece`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def dechunk(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body from ``buf[pos:]``: the body and where it ends; None if incomplete."""
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


@implementer(IPullProducer)
class _AbortWhenFlushed:
    """Abort the transport once everything written so far has left the buffer."""

    def __init__(self, connection: EngineConnection) -> None:
        self._connection = connection
        self._calls = 0

    def resumeProducing(self) -> None:
        """Count the drain notifications; the second one means the buffer is empty."""
        self._calls += 1
        if self._calls >= 2:
            IConsumer(self._connection.transport).unregisterProducer()
            self._connection.abort()

    def stopProducing(self) -> None:
        """Nothing to stop."""


class EngineConnection(Protocol):
    """One HTTP/1.1 keep-alive connection to the fake engine."""

    def __init__(self, handler: IRequestHandler, clock: IReactorTime) -> None:
        self._handler = handler
        self._clock = clock
        self._buf = b""
        self._state = ConnectionState.READING
        self._parsing = False  # guards against parsing again from inside finished()
        self._keepAlive = True
        self._continued = False  # 100 Continue already sent for the request being read
        self._lost: list[Deferred[None]] = []
        self._calls: set[IDelayedCall] = set()

    @property
    def state(self) -> ConnectionState:
        """Where this connection is."""
        return self._state

    def connectionMade(self) -> None:
        # As real engines do (Go's net package, Ollama's, sets TCP_NODELAY by default):
        # each write goes out at once, never held by Nagle's rule until the peer ACKs the
        # last (on a pooled connection that ACK is delayed, up to 40 ms on Linux).
        tcp = ITCPTransport(self.transport, None)
        if tcp is not None:
            tcp.setTcpNoDelay(True)
        self._handler.connectionOpened(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._state = ConnectionState.CLOSED
        for call in self._calls:
            if call.active():
                call.cancel()
        self._calls.clear()
        self._handler.connectionClosed(self)
        lost, self._lost = self._lost, []
        for d in lost:
            d.callback(None)

    def notifyLost(self, d: Deferred[None]) -> None:
        """Fire ``d`` when this connection is lost."""
        self._lost.append(d)

    def abort(self) -> None:
        """Abort the connection at once (a TCP reset, not a clean close)."""
        if self.transport is not None and self._state is not ConnectionState.CLOSED:
            ITCPTransport(self.transport).abortConnection()

    def abortWhenFlushed(self) -> None:
        """Abort the connection once what was written so far has been sent."""
        IConsumer(self.transport).registerProducer(_AbortWhenFlushed(self), False)

    def later(self, delay: float, f: Callable[[], None]) -> None:
        """Call ``f`` after ``delay`` seconds unless the connection is lost first."""

        def run() -> None:
            self._calls.discard(call)
            if self._state is not ConnectionState.CLOSED:
                f()

        call = self._clock.callLater(delay, run)
        self._calls.add(call)

    def write(self, data: bytes) -> None:
        """Write bytes to the connection (nothing once it is gone)."""
        if self.transport is not None and self._state is not ConnectionState.CLOSED:
            self.transport.write(data)

    def dataReceived(self, data: bytes) -> None:
        self._buf += data
        if self._state is ConnectionState.READING and not self._parsing:
            self._parse()

    def finished(self) -> None:
        """Mark the current response complete and serve any pipelined request."""
        if self._state is ConnectionState.CLOSED:
            return
        self._state = ConnectionState.READING
        if not self._keepAlive:
            self._loseConnection()
        elif self._buf and not self._parsing:
            self._parse()

    def _loseConnection(self) -> None:
        if self.transport is not None:
            self.transport.loseConnection()

    def _parse(self) -> None:
        self._parsing = True
        try:
            while self._state is ConnectionState.READING and self._keepAlive and self._buf:
                if not self._parseOne():
                    return
        finally:
            self._parsing = False

    def _badRequest(self) -> None:
        self._keepAlive = False
        self.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        self._loseConnection()

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
            parsed = dechunk(buf, start)
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
        self._state = ConnectionState.ANSWERING
        self._handler.requestReceived(self, method, target, headers, body)
        return True

    def _maybeContinue(self, headers: dict[str, list[str]]) -> None:
        expect = headers.get("expect")
        if expect and not self._continued and expect[0].lower() == "100-continue":
            self._continued = True
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")


class EngineFactory(ServerFactory):
    """Builds the engine's connections."""

    def __init__(self, handler: IRequestHandler, clock: IReactorTime) -> None:
        self._handler = handler
        self._clock = clock

    def buildProtocol(self, addr: IAddress | None) -> EngineConnection:
        return EngineConnection(self._handler, self._clock)
