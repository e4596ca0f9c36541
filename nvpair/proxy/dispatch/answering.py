"""What an exchange writes into its client's answer besides the engine's bytes: the texts of
the proxy's own errors, and values computed once per bounded key rather than per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvpair.proxy.dispatch.relay import adoptResponseHeaders

if TYPE_CHECKING:
    from twisted.web.http_headers import Headers

    from nvpair.proxy.engines import Engine
    from nvpair.proxy.http.interfaces import IServerRequest

MESSAGES = {
    "no_owner": "no node advertises this model",
    "upstream_unreachable": "the last permitted attempt failed at the transport",
    "no_content": "the last permitted attempt produced no content in time",
    "deadline_exceeded": "the job deadline passed while attempts were failing",
    "owner_unavailable": "no owner of this model became available before the deadline",
    "attempts_exhausted": "every permitted dispatch attempt failed",
    "internal": "internal proxy error",
    "bad_request": "the body must be a JSON object with a string model",
    "previous_response_not_found": "previous response not found: the node that stored it is gone",
}


# Per-request values that depend only on a bounded key, computed once.
_NODE_HEADERS: dict[str, tuple[bytes]] = {}  # node id -> the x-nvpair-node values
_DIALECTS: dict[tuple[str, bytes], str] = {}  # (engine id, inference path) -> stats dialect
_CACHE_CAP = 4096


def nodeHeader(nodeId: str) -> tuple[bytes]:
    value = _NODE_HEADERS.get(nodeId)
    if value is None:
        value = (nodeId.encode(),)
        if len(_NODE_HEADERS) < _CACHE_CAP:
            _NODE_HEADERS[nodeId] = value
    return value


def statsDialect(engine: Engine, path: bytes) -> str:
    key = (engine.id, path)
    dialect = _DIALECTS.get(key)
    if dialect is None:
        dialect = engine.statsDialect(path)
        if len(_DIALECTS) < _CACHE_CAP:
            _DIALECTS[key] = dialect
    return dialect


def commitHead(
    request: IServerRequest,
    status: int,
    phrase: bytes,
    headers: Headers,
    length: int | None,
    nodeId: str,
    attempts: int,
) -> None:
    """The client's answer takes the committed response's status and headers, with the
    node that served it and the dispatches it took (``X-Nvpair-Node``, ``-Attempts``)."""
    request.setResponseCode(status, phrase)
    adoptResponseHeaders(headers, request, length)
    responseHeaders = request.responseHeaders
    responseHeaders.setRawHeaders(b"X-Nvpair-Node", nodeHeader(nodeId))
    responseHeaders.setRawHeaders(b"X-Nvpair-Attempts", (b"%d" % attempts,))
