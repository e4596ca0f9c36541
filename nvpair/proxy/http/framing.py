"""HTTP/1.1 rules of the upstream client that are not the parser's: the request's bytes,
and which fields of an engine's response head reach the client (RFC 9110 §7.6.1).

The response head itself is parsed by llhttp (``client``); this module turns the fields
it reported into the response's ``Headers`` and framing facts.  Connection-control fields
(``Connection`` and every field it names, ``Keep-Alive``, ``Proxy-Connection``, ``TE``,
``Trailer``, ``Transfer-Encoding``, ``Upgrade``) are removed; ``Content-Length`` is kept
apart as the response's length.  Pure (no I/O).
"""

from __future__ import annotations

import re

from twisted.web.http_headers import Headers

MAX_HEAD = 1 << 18  # bytes of a response status line + headers (interim answers included)
MAX_BODY_OVERHEAD = 1 << 16  # framing bytes (chunk lines, trailers) read without a payload byte

# Fields that frame or steer one connection: never part of ``Response.headers``.
_CONNECTION_CONTROL = frozenset(
    (
        b"content-length",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    )
)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_OWS = b" \t"


class BadResponse(Exception):
    """The upstream sent something that is not HTTP/1.1 framing we can follow."""


def serializeRequest(
    method: bytes, target: bytes, host: bytes, headers: Headers, body: bytes | None
) -> bytes:
    """The request head (and body) as the bytes to write; ``body=None`` sends no length."""
    parts = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, target, host)]
    for name, values in headers.getAllRawHeaders():
        for value in values:
            parts.append(b"%s: %s\r\n" % (name, value))
    if body is None:
        parts.append(b"\r\n")
    else:
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        parts.append(body)
    return b"".join(parts)


def isToken(value: bytes) -> bool:
    """Whether ``value`` is an HTTP token (a method, a field name)."""
    return _TOKEN.fullmatch(value) is not None


def headerKey(name: bytes) -> bytes:
    """The key ``Headers`` files a header ``name`` under (its canonical capitalization);
    ``ValueError`` for a name that is not an HTTP token."""
    if not isToken(name):
        raise ValueError(f"not an HTTP token: {name!r}")
    probe = Headers()
    probe.addRawHeader(name, b"")
    return next(probe.getAllRawHeaders())[0]


class ResponseHead:
    """An engine's final response head: status, the fields to relay, and its framing."""

    __slots__ = ("code", "phrase", "headers", "contentLength", "transferEncoding")

    def __init__(
        self,
        code: int,
        phrase: bytes,
        headers: Headers,
        contentLength: int | None,
        transferEncoding: bytes | None,
    ) -> None:
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.contentLength = contentLength
        self.transferEncoding = transferEncoding  # lower case, comma-joined, or None


def closesAfterChunked(headers: Headers) -> bool:
    """Whether the engine that sent a chunked answer with ``headers`` closes the connection
    after it although it says keep-alive: llama.cpp's server (``Server: llama.cpp``) does
    after every chunked (streamed) answer, its close a moment later (under load, after the
    next request was already sent on it: that request was lost)."""
    server = headers.getRawHeaders(b"server")
    return server is not None and server[-1].startswith(b"llama.cpp")


def responseHead(code: int, phrase: bytes, fields: list[tuple[bytes, bytes]]) -> ResponseHead:
    """The head of ``fields`` (as llhttp reported them: names are tokens, values have no
    CR, LF or NUL and no leading whitespace); connection-control fields removed.

    ``Content-Length`` has already been checked by the parser (digits only, one field).
    """
    headers = Headers()
    add = headers.addRawHeader
    length: int | None = None
    coding: list[bytes] | None = None
    connection: list[bytes] | None = None
    for name, value in fields:
        lower = name.lower()
        if lower not in _CONNECTION_CONTROL:
            add(name, value.rstrip(_OWS))
        elif lower == b"content-length":
            length = int(value)
        elif lower == b"transfer-encoding":
            if coding is None:
                coding = []
            coding.append(value.rstrip(_OWS).lower())
        elif lower == b"connection":
            if connection is None:
                connection = []
            connection.append(value)
    if connection is not None:
        for value in connection:
            for token in value.split(b","):
                token = token.strip(_OWS)
                if isToken(token):
                    headers.removeHeader(token)
    return ResponseHead(
        code, phrase, headers, length, None if coding is None else b",".join(coding)
    )
