"""The response object of the upstream client (``client``) and its body's delivery.

``Response`` provides ``IResponse`` (``code``, ``phrase``, ``headers``, ``length``,
``deliverBody``).  Body bytes that arrive before ``deliverBody`` are held (and the
connection's read paused) until a protocol is connected; the protocol's transport pauses,
resumes and stops the upstream read, and goes inert once the body ended.  The response
knows its connection only as an ``IBodyConnection``.
"""

from __future__ import annotations

from twisted.internet.interfaces import IProtocol, IPushProducer
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.proxy.http.interfaces import IBodyConnection


@implementer(IPushProducer)
class _BodyTransport:
    """The body protocol's transport: flow control of one response, inert once it ended."""

    __slots__ = ("conn",)

    def __init__(self, conn: IBodyConnection) -> None:
        self.conn: IBodyConnection | None = conn  # None once the body ended

    def pauseProducing(self) -> None:
        if self.conn is not None:
            self.conn.pauseBody(True)

    def resumeProducing(self) -> None:
        if self.conn is not None:
            self.conn.pauseBody(False)

    def stopProducing(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.stopBody()


@implementer(IResponse)
class Response:
    """One upstream response: status, headers, length, and its body on ``deliverBody``."""

    version = (b"HTTP", 1, 1)
    request = None

    __slots__ = (
        "code",
        "phrase",
        "headers",
        "length",
        "previousResponse",
        "_conn",
        "transport",
        "_protocol",
        "_buffer",
        "_ended",
    )

    def __init__(
        self,
        conn: IBodyConnection,
        code: int,
        phrase: bytes,
        headers: Headers,
        length: int | str,
    ) -> None:
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = length  # a byte count, or ``UNKNOWN_LENGTH``
        self.previousResponse: IResponse | None = None
        self._conn = conn
        self.transport = _BodyTransport(conn)
        self._protocol: IProtocol | None = None
        self._buffer: list[bytes] | None = None  # body bytes before deliverBody, if any
        self._ended: Failure | None = None

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response

    def deliverBody(self, protocol: IProtocol) -> None:
        """Connect ``protocol`` to the body: buffered bytes first, then the rest as it comes."""
        if self._protocol is not None:
            raise RuntimeError("the body was already delivered")
        self._protocol = protocol
        # A body protocol's transport is a producer (as in twisted.web.client), not a
        # transport to write to: ``IProtocol.makeConnection`` is typed for the latter.
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]
        buffered, self._buffer = self._buffer or (), None
        for data in buffered:
            if self.transport.conn is None and self._ended is None:
                break
            protocol.dataReceived(data)
        if self._ended is not None:
            protocol.connectionLost(self._ended)
        elif self.transport.conn is not None:
            self.transport.conn.holdBody(False)

    def bodyData(self, data: bytes) -> None:
        """Bytes of the body (from the connection)."""
        if self._protocol is not None:
            self._protocol.dataReceived(data)
        else:
            if self._buffer is None:
                self._buffer = []
            self._buffer.append(data)
            self._conn.holdBody(True)

    def bodyEnded(self, reason: Failure) -> None:
        """The body ended with ``reason`` (from the connection); the transport goes inert."""
        self.transport.conn = None
        if self._protocol is not None:
            self._protocol.connectionLost(reason)
        else:
            self._ended = reason
