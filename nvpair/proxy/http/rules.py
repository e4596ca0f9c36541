"""The RFC 9110/9112 rules a facade applies to a request head that llhttp has parsed.

llhttp (through ``httptools``) rejects malformed framing on its own; what it accepts but a
server must refuse, or must rewrite before routing, is checked here, once the head is
complete: the HTTP version, ``Host`` (present in HTTP/1.1, never repeated, a valid value),
``Transfer-Encoding`` (never in HTTP/1.0, only ``chunked``), and the request target (origin
form, absolute form rewritten to origin form with its authority as ``Host``, ``*`` for
OPTIONS only).  A request that breaks a rule raises ``Refusal``: an error answer and a close.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from httptools import HttpParserInvalidURLError, parse_url
from twisted.web.http_headers import Headers

from nvpair.proxy.http.refusal import Refusal

# uri-host [ ":" port ] (RFC 9110 §7.2): an IP literal in brackets or a reg-name.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?\Z")
_SCHEMES = frozenset((b"http", b"https"))
# Host values already found valid (a client sends the same one every time); bounded.
_GOOD_HOSTS: set[bytes] = set()
MAX_GOOD_HOSTS = 1024
VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}


def clientProtocol(version: str) -> bytes:
    """The request's protocol (``HTTP/1.1`` or ``HTTP/1.0``) from llhttp's version text."""
    proto = VERSIONS.get(version)
    if proto is not None:
        return proto
    if version.startswith("0."):
        raise Refusal(400, "the request line has no HTTP/1.x version")
    raise Refusal(505, "only HTTP/1.0 and HTTP/1.1 are served on this port")


def headersOf(fields: list[tuple[bytes, bytes]]) -> tuple[Headers, int]:
    """The header fields in order, each value without the trailing whitespace llhttp keeps,
    and the bytes they took (each with a colon, a space and CRLF)."""
    headers = Headers()
    add = headers.addRawHeader
    size = 4 * len(fields)
    for name, value in fields:
        size += len(name) + len(value)
        add(name, value.rstrip(b" \t"))
    return headers, size


def checkHead(
    method: bytes, proto: bytes, url: bytes, headers: Headers, codings: Sequence[bytes] | None
) -> bytes:
    """Apply the rules to one head (``codings``: its Transfer-Encoding values); return the
    origin-form target to route (``headers``' ``Host`` is replaced by the authority of an
    absolute-form target)."""
    path = pathOf(url)
    hosts = headers.getRawHeaders(b"host")
    if hosts is None:
        if proto == b"HTTP/1.1":
            raise Refusal(400, "an HTTP/1.1 request must carry a Host header", path)
    elif len(hosts) > 1:
        raise Refusal(400, "the request carries more than one Host header", path)
    if codings is not None:
        if proto != b"HTTP/1.1":
            raise Refusal(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", path)
        if len(codings) != 1 or codings[0].lower() != b"chunked":
            raise Refusal(501, "the only transfer coding accepted is chunked", path)
    if url[:1] == b"/":
        if hosts is not None and hosts[0] not in _GOOD_HOSTS:
            _checkHost(hosts[0], path)
        return url
    if url == b"*":
        if method != b"OPTIONS":
            raise Refusal(400, "the target * is only for OPTIONS", path)
        return url
    target, authority = originForm(url)
    headers.setRawHeaders(b"host", [authority])
    return target


def _checkHost(value: bytes, path: bytes) -> None:
    if not _HOST.match(value):
        raise Refusal(400, "the Host header is not a valid host", path)
    if len(_GOOD_HOSTS) < MAX_GOOD_HOSTS:
        _GOOD_HOSTS.add(value)


def originForm(url: bytes) -> tuple[bytes, bytes]:
    """An absolute-form ``http(s)`` target as its origin form (path and query, no fragment)
    and its authority; anything else is refused."""
    try:
        parsed = parse_url(url)
    except HttpParserInvalidURLError:
        raise Refusal(400, "the request target is not a valid URI") from None
    schema = parsed.schema
    host = parsed.host
    if schema is None or schema.lower() not in _SCHEMES or not host:
        raise Refusal(400, "the request target must be a path or an http(s) URI")
    if parsed.userinfo is not None:
        raise Refusal(400, "the request target must not carry user information")
    target = parsed.path or b"/"
    if parsed.query is not None:
        target += b"?" + parsed.query
    authority = b"[%s]" % host if b":" in host else host
    if parsed.port is not None:
        authority += b":%d" % parsed.port
    return target, authority


def pathOf(url: bytes) -> bytes:
    """The path of a (possibly partial) target, for the shape of an error answer."""
    if url[:1] != b"/":
        return b"/"
    end = url.find(b"?")
    return url if end < 0 else url[:end]
