"""The seams inside ``http/``: what each module needs from the one that calls it.

A callee never imports its caller.  The response knows its connection as an
``IBodyConnection``, the connection knows its pool as an ``IConnectionPool`` (and the pool
knows it back as an ``IPooledConnection``); a request and the reader know their connection
as an ``IServerChannel``, the channel and the reader know the site as an ``ISite``, and the
site knows the facade only as an ``IDoor`` and an ``IErrorShape`` (a leaf of its own,
``nvpair.proxy.errorshape``, which the engine table provides).  The callers declare
``@implementer``; tests fake these and check the fakes with ``verifyObject``.

Attributes are declared with their type for the type checker and as ``Attribute`` for
``verifyObject``.  Interfaces cost nothing at run time: nothing on the request path asks
whether an object provides one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Hashable
from enum import Enum

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IConsumer,
    IProducer,
    IPushProducer,
    IReactorTime,
    ITCPTransport,
)
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import Attribute, Interface

from nvpair.proxy.http.peek import SocketPeek
from nvpair.proxy.http.refusal import Refusal


class IStreamTransport(ITCPTransport, IConsumer, IPushProducer):
    """The transport of an HTTP connection, either way: TCP (or TLS over it) whose reading
    can be paused and resumed, on which a response's producer registers, and which can be
    aborted.  Twisted's TCP and TLS transports offer all of it; this names it for the type
    checker (the protocols' ``transport`` is declared as one)."""


# -- the client side ----------------------------------------------------------------------


class ConnectionState(Enum):
    """Where an upstream connection is: idle in the pool, waiting for a response's head,
    reading its body, or closed (or closing) for good."""

    IDLE = "idle"
    WAITING = "waiting"
    BODY = "body"
    DEAD = "dead"


class IBodyConnection(Interface):
    """What a response needs from its connection: flow control of its body's read."""

    def pauseBody(paused: bool) -> None:
        """The body protocol pauses (``True``) or resumes (``False``) the read."""

    def holdBody(held: bool) -> None:
        """Hold the read (``True``) while no body protocol is connected yet, or let it go."""

    def stopBody() -> None:
        """The body protocol does not want the rest: the connection is dropped."""


class IPooledConnection(Interface):
    """What the pool needs from one of its connections."""

    key: Hashable = Attribute("The pool key (scheme, host, port, ...) it was dialled for.")
    state: ConnectionState = Attribute("Where the connection is (``ConnectionState``).")
    idleSince: float = Attribute("When it was last put back in the pool (reactor seconds).")
    transport: IStreamTransport | None = Attribute("Its transport, once connected.")
    peek: SocketPeek | None = Attribute(
        "Its socket's look before reuse (``peek.SocketPeek``); None where there is no "
        "socket to ask (TLS, test transports)."
    )

    def send(data: bytes, method: bytes, d: Deferred[IResponse]) -> None:
        """Write one serialized request; ``d`` fires with its response (or fails)."""

    def abort() -> None:
        """Drop the connection at once (a cancelled request)."""

    def whenClosed() -> Deferred[None]:
        """A Deferred firing once the connection is closed."""


class IConnectionPool(Interface):
    """What a connection needs from the pool that made it."""

    def release(conn: IPooledConnection) -> None:
        """``conn`` finished a response and may be reused (or is one too many)."""

    def lost(conn: IPooledConnection) -> None:
        """``conn`` closed: forget it if it was idle."""

    def bytesAfterAnswer(conn: IPooledConnection) -> None:
        """Bytes came on ``conn`` after a complete answer: it is closing; count it."""


# -- the server side ----------------------------------------------------------------------


class IServerRequest(Interface):
    """One request received by a facade and its response: the part of twisted.web's
    ``Request`` surface the proxy uses (``request.ServerRequest``)."""

    channel: IServerChannel | None = Attribute("Its connection; None once the client left.")
    method: bytes = Attribute("The request method.")
    uri: bytes = Attribute("The origin-form target (path and query).")
    path: bytes = Attribute("The target's path, without the query.")
    clientproto: bytes = Attribute("``HTTP/1.1`` or ``HTTP/1.0``.")
    requestHeaders: Headers = Attribute("The request's header fields.")
    responseHeaders: Headers = Attribute("The response's header fields, until it is sent.")
    content: io.BytesIO | None = Attribute("The body once it fully arrived, else None.")
    tooLarge: bool = Attribute("Whether the body was larger than the site accepts.")
    persistent: bool = Attribute("Whether the connection serves another request after it.")
    code: int = Attribute("The response status.")
    code_message: bytes = Attribute("The response's reason phrase.")
    startedWriting: bool = Attribute("Whether the response head was sent.")
    finished: bool = Attribute("Whether the response ended.")
    disconnected: bool = Attribute("Whether the client left before the response ended.")
    producer: IProducer | None = Attribute("The registered producer of the response body.")

    def getHeader(name: bytes) -> bytes | None:
        """The last value of a request header, or None."""

    def setResponseCode(code: int, message: bytes | None = None) -> None:
        """Set the status and its phrase (the standard one if none is given)."""

    def setHeader(name: bytes, value: bytes) -> None:
        """Set one response header, replacing any earlier value."""

    def write(data: bytes) -> None:
        """Send body bytes; the first call sends the head with them."""

    def finish() -> None:
        """End the response."""

    def registerProducer(producer: IProducer, streaming: bool) -> None:
        """Register the producer of the response body with the client connection."""

    def unregisterProducer() -> None:
        """Unregister the body's producer."""

    def notifyFinish() -> Deferred[None]:
        """Fires when the response is finished; fails if the client leaves first."""

    def whenLost(callback: Callable[[Failure], object]) -> None:
        """Call ``callback`` with the reason if the client leaves before the end."""

    def connectionLost(reason: Failure) -> None:
        """The client connection closed before the response finished."""


class IServerChannel(Interface):
    """What a request and the request reader need from their client connection."""

    transport: IStreamTransport | None = Attribute("The client connection's transport.")

    def send(data: bytes) -> None:
        """Write answer bytes to the client (nothing once the connection is gone)."""

    def requestDone(request: IServerRequest) -> None:
        """The answer to ``request`` is complete."""

    def queue(size: int, item: IServerRequest | Refusal) -> None:
        """A complete request (holding ``size`` bytes), or a refusal, joins the queue."""


class IDoor(Interface):
    """Where a facade's requests go once their head and body arrived."""

    def handle(request: IServerRequest) -> None:
        """Answer ``request`` (now or later)."""

    def crashed(request: IServerRequest, error: Exception) -> None:
        """``handle`` raised ``error`` for ``request``."""


class ISite(Interface):
    """What a client connection and its request reader need from the site that made it."""

    door: IDoor = Attribute("Where requests go.")
    clock: IReactorTime = Attribute("The clock of the read deadlines.")
    maxBody: int = Attribute("The largest body kept, in bytes (read anew per request).")
    maxHeaderBytes: int = Attribute("The largest request head, in bytes (read anew per request).")
    headerReadTimeout: float = Attribute("Seconds a client has to send a head; 0: no limit.")
    slowClients: int = Attribute("How many connections were cut for being too slow.")

    def refuse(request: IServerRequest, status: int, message: str) -> None:
        """Answer a request the HTTP layer refuses, in the engine's shape, and close."""
