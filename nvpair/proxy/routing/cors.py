"""The browser rules of protocol §12 (spec §5.8) as pure functions over header maps.

Header maps given to these functions are ``Mapping[str, str]`` keyed by lowercase names, with
repeated headers already joined with ``", "``.  Returned maps use proper-case names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

CORS_PREFIX = "access-control-"

ALLOW_ORIGIN = "Access-Control-Allow-Origin"
ALLOW_METHODS = "Access-Control-Allow-Methods"
ALLOW_HEADERS = "Access-Control-Allow-Headers"
ALLOW_CREDENTIALS = "Access-Control-Allow-Credentials"
ALLOW_PRIVATE_NETWORK = "Access-Control-Allow-Private-Network"
EXPOSE_HEADERS = "Access-Control-Expose-Headers"
MAX_AGE = "Access-Control-Max-Age"
VARY = "Vary"

# The request headers a multi-target preflight forwards to each node: the browser's question
# and nothing else, never Cookie, Authorization, Proxy-Authorization or other credentials.
PREFLIGHT_FORWARD_HEADERS: tuple[str, ...] = (
    "origin",
    "access-control-request-method",
    "access-control-request-headers",
    "access-control-request-private-network",
)

_DIGITS = re.compile(r"[0-9]+")
_CORS_PREFIX_BYTES = CORS_PREFIX.encode("ascii")


def isPreflight(method: bytes | str, headers: Mapping[str, str]) -> bool:
    """Whether a request is a CORS preflight: OPTIONS with Origin and a requested method."""
    if isinstance(method, bytes):
        method = method.decode("latin-1")
    return (
        method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
    )


def preflightHeaders(headers: Mapping[str, str]) -> dict[str, str]:
    """The subset of a preflight's request headers forwarded to each node."""
    return {name: headers[name] for name in PREFLIGHT_FORWARD_HEADERS if name in headers}


def originAllowed(origin: str, headers: Mapping[str, str]) -> bool:
    """Whether a response's Access-Control-Allow-Origin is ``*`` or equals ``origin``."""
    allowed = headers.get("access-control-allow-origin")
    if allowed is None:
        return False
    allowed = allowed.strip()
    return allowed == "*" or allowed == origin


def _allowOrigin(origin: str, responders: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """ACAO (with Vary) when every responder allowed the origin, else nothing."""
    if not responders or not all(originAllowed(origin, r) for r in responders):
        return {}
    if all(r["access-control-allow-origin"].strip() == "*" for r in responders):
        return {ALLOW_ORIGIN: "*"}
    return {ALLOW_ORIGIN: origin, VARY: "Origin"}


def _allTrue(name: str, responders: Sequence[Mapping[str, str]]) -> bool:
    """Whether every responder sent ``name: true``."""
    return bool(responders) and all(r.get(name, "").strip() == "true" for r in responders)


def _tokens(value: str) -> list[str]:
    """The non-empty comma-separated tokens of a header value."""
    return [token for token in (part.strip() for part in value.split(",")) if token]


def _intersect(
    name: str, responders: Sequence[Mapping[str, str]], unwildcarded: frozenset[str] = frozenset()
) -> str | None:
    """The case-insensitive intersection of a list header over every responder.

    ``*`` in a responder's list matches any token except those in ``unwildcarded``; when
    every responder sent ``*`` the result keeps it.  Spelling and order come from the first
    responder that names a token.  ``None`` when a responder lacks the header or nothing
    is common.
    """
    if not responders:
        return None
    lists: list[list[str]] = []
    for responder in responders:
        value = responder.get(name)
        if value is None:
            return None
        lists.append(_tokens(value))
    sets = [{token.lower() for token in tokens} for tokens in lists]
    wild = [("*" in tokens) for tokens in sets]

    def grantedByAll(lowered: str) -> bool:
        return all(
            lowered in tokens or (isWild and lowered not in unwildcarded)
            for tokens, isWild in zip(sets, wild, strict=True)
        )

    result: list[str] = ["*"] if all(wild) else []
    seen = {"*"}
    for tokens in lists:
        for token in tokens:
            lowered = token.lower()
            if lowered in seen:
                continue
            seen.add(lowered)
            if grantedByAll(lowered):
                result.append(token)
    return ", ".join(result) if result else None


def _maxAge(responders: Sequence[Mapping[str, str]]) -> str | None:
    """The smallest Max-Age, or ``None`` if any responder omitted it or sent a non-integer."""
    ages: list[int] = []
    for responder in responders:
        value = responder.get("access-control-max-age", "").strip()
        if not _DIGITS.fullmatch(value):
            return None
        ages.append(int(value))
    return str(min(ages)) if ages else None


def preflightAnswer(origin: str, responders: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The headers of the 204 answering a multi-target preflight: the responders' intersection.

    Each header is decided on its own: Allow-Origin only if every responder allowed the
    origin, Allow-Methods/Allow-Headers as the intersection, Max-Age the smallest,
    Allow-Credentials and Allow-Private-Network only if all said ``true``.  With no
    responders nothing is granted.
    """
    answer = _allowOrigin(origin, responders)
    methods = _intersect("access-control-allow-methods", responders)
    if methods is not None:
        answer[ALLOW_METHODS] = methods
    # Fetch never lets a ``*`` in Allow-Headers stand for Authorization.
    allowHeaders = _intersect(
        "access-control-allow-headers", responders, frozenset({"authorization"})
    )
    if allowHeaders is not None:
        answer[ALLOW_HEADERS] = allowHeaders
    maxAge = _maxAge(responders)
    if maxAge is not None:
        answer[MAX_AGE] = maxAge
    if _allTrue("access-control-allow-credentials", responders):
        answer[ALLOW_CREDENTIALS] = "true"
    if _allTrue("access-control-allow-private-network", responders):
        answer[ALLOW_PRIVATE_NETWORK] = "true"
    return answer


def listCors(origin: str, responders: Sequence[Mapping[str, str]]) -> dict[str, str] | None:
    """CORS headers for a merged fleet model list, or ``None`` if some responder denied.

    ``None`` means the answer is 403 without CORS headers.  With no responders (an empty
    fleet) nobody denied, but no engine granted anything either: the result is empty.
    """
    if not responders:
        return {}
    headers = _allowOrigin(origin, responders)
    if not headers:
        return None
    if _allTrue("access-control-allow-credentials", responders):
        headers[ALLOW_CREDENTIALS] = "true"
    expose = _intersect("access-control-expose-headers", responders)
    if expose is not None:
        headers[EXPOSE_HEADERS] = expose
    return headers


def invalidListCors(origin: str, responders: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """CORS headers for the 502 invalid-inventory answer: Allow-Origin only if all allowed."""
    return _allowOrigin(origin, responders)


def stripCors(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The raw headers without any ``Access-Control-*`` header."""
    return [
        (name, value) for name, value in headers if not name.lower().startswith(_CORS_PREFIX_BYTES)
    ]
