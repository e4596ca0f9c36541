"""The HTTP surface of a facade: its connection factory and the errors the proxy generates.

``FacadeSite`` builds one ``server.ServerChannel`` per connection, sharing the facade's
door (``FrontDoor``, or ``PeerDoor`` on the cluster personality) and its limits:
``--max-body`` (413 beyond, the body read and dropped in constant memory),
``--max-header-bytes`` (431) and ``--header-read-timeout`` (a client slower than that to
send a head, or idle that long in a body or between requests, is cut).  ``sendError``
writes a proxy-generated answer in the engine's error shape; ``FacadeSite.refuse`` uses it
for requests the HTTP layer refuses (reason ``bad_request``, ``internal`` for a 500) and
reports each refusal's reason to whoever counts them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory
from twisted.web import http
from zope.interface import implementer

from nvpair.proxy.errorshape import IErrorShape
from nvpair.proxy.http.interfaces import IDoor, IServerRequest, ISite
from nvpair.proxy.http.server import ServerChannel

_PHRASES = {
    400: b"Bad Request",
    403: b"Forbidden",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    505: b"HTTP Version Not Supported",
}


def sendError(
    request: IServerRequest,
    engine: IErrorShape,
    status: int,
    reason: str,
    message: str,
    retryAfter: int | None = None,
) -> None:
    """Answer with a response the proxy generates, in the engine's shape, without CORS headers."""
    body = engine.errorBody(request.path, reason, message)
    request.setResponseCode(status, _PHRASES.get(status))
    headers = request.responseHeaders
    for name, _ in list(headers.getAllRawHeaders()):
        if name.lower().startswith(b"access-control-"):
            headers.removeHeader(name)
    headers.setRawHeaders(b"content-type", [b"application/json"])
    headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
    headers.setRawHeaders(b"date", [http.datetimeToString()])
    if retryAfter is not None:
        headers.setRawHeaders(b"retry-after", [b"%d" % retryAfter])
    request.write(body)
    request.finish()


@implementer(IErrorShape)
class _OpenAIShape:
    """The OpenAI error shape (llama.cpp's off its Messages routes, the one every engine uses
    off Ollama's native routes and Anthropic's Messages), for a door that names no engine.
    The facade's engine table has the same shape there; ``tests/http/test_strictrequests.py``
    holds the two to it."""

    def errorBody(self, path: bytes, reason: str, message: str) -> bytes:
        doc = {"error": {"message": message, "type": "proxy_error", "code": reason}}
        return json.dumps(doc).encode("utf-8")


OPENAI_SHAPE = _OpenAIShape()


@implementer(ISite)
class FacadeSite(Factory):
    """Builds the ``ServerChannel`` of each connection to one facade personality (plaintext
    or peer TLS) and holds what they share: the door, the clock and the limits.

    ``engine`` gives the shape of the HTTP layer's refusals (the OpenAI shape, llama.cpp's,
    when none is given); ``refused`` is told the reason of each one (to count it)."""

    noisy = False

    def __init__(
        self,
        door: IDoor,
        clock: IReactorTime,
        maxBody: int,
        headerReadTimeout: float,
        maxHeaderBytes: int,
        engine: IErrorShape | None = None,
        refused: Callable[[str], object] | None = None,
    ) -> None:
        self.door = door
        self.engine = engine if engine is not None else OPENAI_SHAPE
        self.refused = refused
        self.clock = clock
        self.maxBody = maxBody
        self.headerReadTimeout = headerReadTimeout
        self.maxHeaderBytes = maxHeaderBytes
        self.slowClients = 0

    def refuse(self, request: IServerRequest, status: int, message: str) -> None:
        """Answer a request the HTTP layer refuses, in the engine's shape, and close."""
        request.setHeader(b"connection", b"close")
        reason = "internal" if status == 500 else "bad_request"
        if self.refused is not None:
            self.refused(reason)
        sendError(request, self.engine, status, reason, message)

    def buildProtocol(self, addr: IAddress | None) -> ServerChannel:
        channel = ServerChannel(self)
        channel.factory = self
        return channel
