"""One request received by a facade, and the response written for it.

``ServerRequest`` offers the part of twisted.web's ``Request`` surface the proxy uses
(method, uri, path, request and response ``Headers``, ``setResponseCode``, ``setHeader``,
``write``, ``finish``, producers, ``notifyFinish``) with the same framing rules: an HTTP/1.1
answer without a Content-Length is chunked, HEAD and 204/304 answers carry no body, an
HTTP/1.0 answer without a length ends with the connection.  The response head leaves with
the first body bytes in one send.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from enum import Enum

from twisted.internet import defer
from twisted.internet.interfaces import IProducer
from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, RESPONSES
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.http.interfaces import IServerChannel, IServerRequest

HTTP11 = b"HTTP/1.1"


class BodyFraming(Enum):
    """How the response body goes on the wire, decided with its head."""

    PLAIN = "plain"  # as it is: a Content-Length body, or one that ends with the connection
    CHUNKED = "chunked"  # in chunks (HTTP/1.1 without a Content-Length)
    NONE = "none"  # no body at all (HEAD, 1xx, 204, 304): written bytes are dropped


PLAIN = BodyFraming.PLAIN
CHUNKED = BodyFraming.CHUNKED
NO_BODY = BodyFraming.NONE


@implementer(IServerRequest)
class ServerRequest:
    """A request on a facade connection and its response (a lean twisted.web ``Request``)."""

    __slots__ = (
        "channel",
        "method",
        "uri",
        "path",
        "clientproto",
        "requestHeaders",
        "responseHeaders",
        "content",
        "tooLarge",
        "persistent",
        "code",
        "code_message",
        "startedWriting",
        "finished",
        "disconnected",
        "_framing",
        "_notifications",
        "_onLost",
        "producer",
    )

    def __init__(
        self,
        channel: IServerChannel,
        method: bytes,
        uri: bytes,
        clientproto: bytes,
        headers: Headers,
        persistent: bool,
    ) -> None:
        self.channel: IServerChannel | None = channel
        self.method = method
        self.uri = uri
        query = uri.find(b"?")
        self.path = uri if query < 0 else uri[:query]
        self.clientproto = clientproto
        self.requestHeaders = headers
        self.responseHeaders = Headers()
        self.content: io.BytesIO | None = None  # the body, once it has fully arrived
        self.tooLarge = False
        self.persistent = persistent
        self.code = 200
        self.code_message = b"OK"
        self.startedWriting = False
        self.finished = False
        self.disconnected = False
        self._framing = PLAIN
        self._notifications: list[defer.Deferred[None]] | None = None
        self._onLost: Callable[[Failure], object] | None = None
        self.producer: IProducer | None = None

    # -- the request ----------------------------------------------------------------------

    def getHeader(self, name: bytes) -> bytes | None:
        """The last value of a request header, or ``None``."""
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None

    # -- the response ---------------------------------------------------------------------

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        """Set the status code and reason phrase (the standard phrase if none is given)."""
        self.code = code
        self.code_message = message if message is not None else RESPONSES.get(code, b"")

    def setHeader(self, name: bytes, value: bytes) -> None:
        """Set one response header, replacing any earlier value."""
        self.responseHeaders.setRawHeaders(name, [value])

    def write(self, data: bytes) -> None:
        """Send body bytes; the first call sends the response head with them."""
        if self.finished:
            raise RuntimeError("write called on a request after finish")
        channel = self.channel
        if channel is None:
            return  # the client is gone; finish will say so
        if not self.startedWriting:
            self.startedWriting = True
            head = self._head()
            if data and self._framing is not NO_BODY:
                head += self._frame(data)
            channel.send(head)
            return
        if data and self._framing is not NO_BODY:
            channel.send(self._frame(data))

    def _frame(self, data: bytes) -> bytes:
        if self._framing is CHUNKED:
            return b"%x\r\n%s\r\n" % (len(data), data)
        return data

    def _head(self) -> bytes:
        code = self.code
        parts = [b"%s %d %s\r\n" % (self.clientproto, code, self.code_message)]
        hasLength = False
        connection = None
        # ``getAllRawHeaders`` gives names in their canonical capitalization.
        for name, values in self.responseHeaders.getAllRawHeaders():
            if name == b"Content-Length":
                hasLength = True
            elif name == b"Connection":
                connection = values[-1]
            for value in values:
                parts.append(b"%s: %s\r\n" % (name, value))
        if self.method == b"HEAD" or code in NO_BODY_CODES or code < 200:
            self._framing = NO_BODY
        elif not hasLength:
            if self.clientproto == HTTP11:
                parts.append(b"Transfer-Encoding: chunked\r\n")
                self._framing = CHUNKED
            else:
                self.persistent = False
        if connection is not None and b"close" in connection.lower():
            self.persistent = False
        elif not self.persistent and self.clientproto == HTTP11:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def finish(self) -> None:
        """End the response; the connection then serves its next request or closes."""
        if self.disconnected:
            raise RuntimeError("finish called on a request after its connection was lost")
        if self.finished:
            return
        if not self.startedWriting:
            self.write(b"")
        channel = self.channel
        if self._framing is CHUNKED and channel is not None:
            channel.send(b"0\r\n\r\n")
        self.finished = True
        self._onLost = None
        if self.producer is not None:
            self.unregisterProducer()
        self._release()
        notifications, self._notifications = self._notifications, None
        if channel is not None:
            channel.requestDone(self)
        if notifications:
            for d in notifications:
                d.callback(None)

    def _release(self) -> None:
        content, self.content = self.content, None
        if content is not None:
            content.close()

    # -- flow control and endings ----------------------------------------------------------

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        """Register the producer of this response's body with the client connection."""
        self.producer = producer
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        """Unregister the body's producer."""
        self.producer = None
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.unregisterProducer()

    def notifyFinish(self) -> defer.Deferred[None]:
        """A Deferred firing when the response is finished, or failing if the client leaves."""
        d: defer.Deferred[None] = defer.Deferred()
        if self._notifications is None:
            self._notifications = []
        self._notifications.append(d)
        return d

    def whenLost(self, callback: Callable[[Failure], object]) -> None:
        """Call ``callback`` with the reason if the client leaves before the response is
        finished (``notifyFinish``'s failure, without a Deferred; one callback)."""
        self._onLost = callback

    def connectionLost(self, reason: Failure) -> None:
        """The client connection closed before the response finished."""
        self.disconnected = True
        self.channel = None
        self.producer = None
        self._release()
        onLost, self._onLost = self._onLost, None
        if onLost is not None:
            onLost(reason)
        notifications, self._notifications = self._notifications, None
        if notifications:
            for d in notifications:
                d.errback(reason)
