"""JSON-RPC 2.0 line framing shared by the proxy's broker channel and the supervisor client.

One JSON object per ``\\n``-terminated line, at most ``MAX_LINE`` bytes (protocol §2).  An
over-long line is discarded up to its terminating newline and reported once; the stream
keeps going.  ``resolveAddress`` is the method naming both sides share (protocol §3).
"""

from __future__ import annotations

import json
import re

from twisted.internet.protocol import Protocol

from nvpair.proxy.engines import ENGINES

MAX_LINE = 1 << 20

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
FACADE_NOT_ENABLED = -32004
BIND_FAILED = -32010


def resolveAddress(method: str) -> tuple[str | None, str]:
    """Split ``engine:name`` when the part before the first colon is a known engine id."""
    head, sep, rest = method.partition(":")
    if sep and head in ENGINES:
        return head, rest
    return None, method


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One encoder for every message (``json.dumps`` with options builds one per call):
# compact, UTF-8 text as is, NaN allowed; no circular-reference check (messages are trees).
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, check_circular=False, default=_unencodable
)
_encode = _ENCODER.encode


# A lone surrogate (``"\\ud800"`` in a client's JSON body decodes to one) has no UTF-8 form.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escapeSurrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def utf8(text: str) -> bytes:
    """UTF-8 bytes of JSON ``text``; lone surrogates (only ever inside strings) are written
    as ``\\uXXXX`` escapes, so the line stays valid UTF-8 and decodes to the same string."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escapeSurrogate, text).encode("utf-8")


def encodeValue(value: object) -> str:
    """The compact JSON text of one value, exactly as ``encode`` writes it inside a message."""
    return _encode(value)


def encode(message: dict[str, object]) -> bytes:
    """Serialize one message as a compact UTF-8 JSON line."""
    return utf8(_encode(message) + "\n")


def request(id: int | str, method: str, params: object) -> dict[str, object]:
    """Build a JSON-RPC request object."""
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def notification(method: str, params: object) -> dict[str, object]:
    """Build a JSON-RPC notification object."""
    return {"jsonrpc": "2.0", "method": method, "params": params}


def result(id: object, value: object) -> dict[str, object]:
    """Build a successful response."""
    return {"jsonrpc": "2.0", "id": id, "result": value}


def error(id: object, code: int, message: str, data: object = None) -> dict[str, object]:
    """Build an error response; ``data`` is included only when given."""
    body: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": body}


class Prepared(dict[str, object]):
    """Notification params that write their own JSON text.

    Whoever builds one fixes its shape, so the JSON can come from a template rather than
    the general encoder; ``paramsJSON`` must return exactly ``encodeValue(self)``, and
    ``line`` exactly ``encode(notification(method, self))``.
    """

    __slots__ = ()

    def paramsJSON(self) -> str:
        """The compact JSON text of these params (the same text ``encodeValue`` gives)."""
        return encodeValue(self)

    def line(self, method: str) -> bytes:
        """The notification line carrying these params."""
        head = HEADS.get(method) or notificationHead(method)
        text = head + self.paramsJSON() + "}\n"
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return utf8(text)


# '{"jsonrpc":"2.0","method":"<method>","params":' per method name (a small, fixed set).
HEADS: dict[str, str] = {}
_MAX_HEADS = 256


def notificationHead(method: str) -> str:
    """The text of a notification up to its params (remembered for the first 256 names)."""
    head = '{"jsonrpc":"2.0","method":' + encodeValue(method) + ',"params":'
    if len(HEADS) < _MAX_HEADS:
        HEADS[method] = head
    return head


def notificationLine(method: str, params: dict[str, object]) -> bytes:
    """The line of ``notification(method, params)``: the same bytes as ``encode`` gives."""
    if isinstance(params, Prepared):
        return params.line(method)
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


class LineFramer(Protocol):
    """Split a byte stream into lines of at most ``maxLine`` bytes.

    Subclasses implement ``lineReceived`` and ``lineTooLong``.  A line over the limit is
    dropped whole (everything up to its newline) and ``lineTooLong`` is called once for it.
    """

    maxLine: int = MAX_LINE

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._discarding = False

    def dataReceived(self, data: bytes) -> None:
        buf = self._buffer
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._discarding:
                self._discarding = False
            elif len(buf) + (nl - start) > self.maxLine:
                buf.clear()
                self.lineTooLong()
            else:
                if buf:
                    buf += data[start:nl]
                    line = bytes(buf)
                    buf.clear()
                else:
                    line = data[start:nl]
                self.lineReceived(line)
            start = nl + 1
        if self._discarding or start >= len(data):
            return
        buf += data[start:]
        if len(buf) > self.maxLine:
            buf.clear()
            self._discarding = True
            self.lineTooLong()

    def lineReceived(self, line: bytes) -> None:
        raise NotImplementedError

    def lineTooLong(self) -> None:
        raise NotImplementedError

    def pendingBytes(self) -> int:
        """How many bytes of an unterminated line are buffered."""
        return len(self._buffer)
