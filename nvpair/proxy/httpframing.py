"""HTTP/1.1 framing for the upstream client: the request's bytes, the response head, and
the chunked decoder.  Pure (no I/O) and tuned for the request path.

Heads are parsed with one ``splitlines`` and caches of header names (the key in
``Headers``; for connection-control names, their lower case).  Chunked bodies are decoded
with ``bytes.find`` from an index; a run of whole chunks whose plain CRLF size lines were
seen before costs one slice and one dict lookup each (``_LINES`` keys the first size line
of a run, ``_FRAMES`` the CRLF after a chunk's data plus the next size line), and anything
else -- extensions, bare LFs, trailers, a line or chunk cut by the end of a read -- goes
through the general per-line state machine.  The rules: sizes are 1 to 16 hex digits
(extensions after ``;`` ignored), a line is at most ``MAX_LINE`` bytes until its LF, a
chunk's data is followed by CRLF (or a bare LF), and the body ends at the empty line after
the trailers.
"""

from __future__ import annotations

import re
from typing import Any

from twisted.web.http import NO_BODY_CODES
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

MAX_HEAD = 1 << 18  # response status line + headers
MAX_LINE = 1 << 12  # one chunk-size or trailer line
# Connection-control headers: framing, not part of ``Response.headers`` (as in twisted.web).
_CONNECTION_CONTROL = frozenset((
    b"content-length", b"connection", b"keep-alive", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"proxy-connection",
))
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_BLANKS = b" \t"
_CONTINUATION = (b" ", b"\t")

# Body framings and chunked-decoder states.
LENGTH, CHUNKED, CLOSE = range(3)
SIZE, DATA, CRLF, TRAILER = range(4)

# A parsed head: code, phrase, headers, length, framing, Content-Length, reusable.
ParsedHead = tuple[int, bytes, Headers, Any, int, int, bool]


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


def splitHead(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first head in ``buf`` (without its empty line) and the bytes after it; None if
    the head is not complete yet.  Lines end in CRLF or a bare LF."""
    end = buf.find(b"\r\n\r\n")
    if end >= 0 and buf.find(b"\n\n", 0, end) < 0:  # the usual case: CRLF throughout
        return buf[:end], buf[end + 4:]
    match = _HEAD_END.search(buf)
    if match is None:
        return None
    return buf[: match.start()], buf[match.end():]


def parseHead(head: bytes, isHead: bool) -> ParsedHead | None:
    """The response of ``head`` (without its empty line); None for an interim 1xx answer.

    Raises ``BadResponse`` or ``ValueError`` for a head that is not HTTP/1.x.
    """
    lines = head.splitlines()
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or len(status[1]) != 3:
        raise BadResponse("bad status line")
    code = int(status[1])
    if 100 <= code < 200:
        return None
    phrase = status[2] if len(status) == 3 else b""
    headers = Headers()
    raw = headers._rawHeaders
    keys = _KEYS
    control: dict[bytes, list[bytes]] = {}
    last: list[bytes] | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        key = keys.get(name)
        if key is None or not sep:  # not a known end-to-end header: the full checks
            info: tuple[bytes, bytes | None] | None = _CONTROL.get(name) if sep else None
            if info is None:
                if line[:1] in _CONTINUATION:
                    if last is None:
                        raise BadResponse("continuation before a header")
                    last[-1] = last[-1] + b" " + line.strip()
                    continue
                if not sep or not name or name[-1] in _BLANKS:
                    raise BadResponse("bad header line")
                info = _nameInfo(name)
            key, lower = info
            if lower is not None:  # connection control: framing, kept apart
                value = value.strip()
                values = control.get(lower)
                if values is None:
                    control[lower] = [value]
                else:
                    values.append(value)
                if not (isHead and lower == b"content-length"):
                    last = None
                    continue
        value = value.strip()
        last = raw.get(key)
        if last is None:
            last = raw[key] = [value]
        else:
            last.append(value)
    connection = control.get(b"connection")
    reusable = status[0] == b"HTTP/1.1" and (
        connection is None or b"close" not in b",".join(connection).lower()
    )
    length: Any = UNKNOWN_LENGTH
    remaining = 0
    if isHead or code in NO_BODY_CODES:
        length, mode = 0, LENGTH
    elif b"transfer-encoding" in control:
        if control[b"transfer-encoding"][-1].lower().rsplit(b",", 1)[-1].strip() != b"chunked":
            raise BadResponse("unknown transfer coding")
        mode = CHUNKED
    elif b"content-length" in control:
        values = control[b"content-length"]
        if len(values) == 1 and b"," not in values[0]:  # the usual case: one value
            length = remaining = int(values[0])
            if length < 0:
                raise BadResponse("bad content-length")
        else:
            lengths = {int(v) for v in b",".join(values).split(b",")}
            if len(lengths) != 1 or min(lengths) < 0:
                raise BadResponse("bad content-length")
            length = remaining = lengths.pop()
        mode = LENGTH
    else:
        mode = CLOSE
        reusable = False
    return code, phrase, headers, length, mode, remaining, reusable


def headerKey(name: bytes) -> bytes:
    """The key ``Headers`` files a header ``name`` under (its canonical capitalization);
    ``ValueError`` for a name that is not an HTTP token.  Shared by the client's head parser
    and the facades' request parser, each of which caches it per name seen."""
    probe = Headers()
    probe.addRawHeader(name, b"")
    return next(iter(probe._rawHeaders))


def _nameInfo(name: bytes) -> tuple[bytes, bytes | None]:
    """A header name's key in ``Headers`` and its lower case if it is connection control
    (remembered for the next heads); ``ValueError`` for a name that is not a token."""
    lower = name.lower()
    control = lower if lower in _CONNECTION_CONTROL else None
    key = headerKey(name)
    if control is not None:
        if len(_CONTROL) < 256:
            _CONTROL[name] = (key, control)
    elif len(_KEYS) < 1024:
        _KEYS[name] = key
    return key, control


# Header names seen: an end-to-end one's key in ``Headers``; a control one's key and lower case.
_KEYS: dict[bytes, bytes] = {}
_CONTROL: dict[bytes, tuple[bytes, bytes]] = {}


class ChunkDecoder:
    """Decodes a chunked body read by read: payload bytes out, the end found."""

    __slots__ = ("state", "remaining", "_buf")

    def __init__(self) -> None:
        self.state = SIZE
        self.remaining = 0  # data bytes left of the current chunk
        self._buf = b""  # an incomplete line held for the next read

    def reset(self) -> None:
        """Ready for a new body."""
        self.state = SIZE
        self.remaining = 0
        self._buf = b""

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """The payload in ``data`` (``b""`` if none) and, if the body ended in it, the
        bytes after the end (else None); raises ``BadResponse`` for broken framing."""
        state = self.state
        remaining = self.remaining
        if self._buf:
            buf = self._buf + data
        elif state == DATA and len(data) < remaining:  # inside a chunk bigger than the read
            self.remaining = remaining - len(data)
            return data, None
        else:
            buf = data
        size = len(buf)
        pos = 0
        parts: list[bytes] = []
        append = parts.append
        find = buf.find
        startswith = buf.startswith
        known = _LINES.get
        frame = _FRAMES.get
        done = False
        while pos < size:
            if state == DATA:
                end = pos + remaining
                if end > size:
                    append(buf[pos:])
                    remaining = end - size
                    pos = size
                    break
                append(buf[pos:end])
                pos, remaining = end, 0
                if startswith(b"\r\n", pos):  # the usual case: CRLF right behind
                    pos += 2
                    state = SIZE
                else:
                    state = CRLF
                continue
            eol = find(b"\n", pos)
            if state == SIZE and eol >= 0:
                n = known(buf[pos:eol])
                if n is not None:
                    # The usual case: a run of whole chunks with sizes seen before.  Each
                    # next chunk's key is the CRLF after the data and a size line as long
                    # as this one's, CRLF included: one slice and one lookup check both.
                    # The run ends at a key not known (another length, an extension, the
                    # last chunk ...) or at the end of the read.
                    width = eol - pos + 3
                    start = eol + 1
                    while True:
                        end = start + n
                        append(buf[start:end])
                        start = end + width
                        following = frame(buf[end:start])
                        if following is None:
                            break
                        n = following
                    if end > size:  # the read ends inside this chunk (or before its data:
                        # a key cut short by the end of the read can be a shorter one)
                        pos, remaining, state = size, min(n, end - size), DATA
                        break
                    if startswith(b"\r\n", end):  # as after any chunk's data
                        pos = end + 2
                    else:
                        pos, state = end, CRLF
                    continue
            if eol < 0:
                if size - pos > MAX_LINE:
                    raise BadResponse("chunk line too long")
                break
            if eol > pos and buf[eol - 1] == 13:
                line = buf[pos:eol - 1]
                crlf = True
            else:
                line = buf[pos:eol]
                crlf = False
            pos = eol + 1
            if state == SIZE:
                if _HEX.fullmatch(line) is None:
                    line = line.split(b";", 1)[0].strip()
                    if _HEX.fullmatch(line) is None:
                        raise BadResponse("bad chunk size")
                    remaining = int(line, 16)
                else:
                    remaining = int(line, 16)
                    if remaining and crlf and len(_LINES) < 2048:
                        _learn(line, remaining)
                state = DATA if remaining else TRAILER
            elif state == CRLF:
                if line:
                    raise BadResponse("chunk not followed by CRLF")
                state = SIZE
            elif not line:  # TRAILER: the empty line ends the body
                done = True
                break
        self.state = state
        self.remaining = remaining
        self._buf = b"" if done or pos >= size else buf[pos:]
        payload = b"" if not parts else parts[0] if len(parts) == 1 else b"".join(parts)
        return payload, (buf[pos:] if done else None)


def _learn(line: bytes, size: int) -> None:
    """Remember a plain size line (1-16 hex digits, non-zero, CRLF) for the fast path."""
    _LINES[line + b"\r"] = size
    _FRAMES[b"\r\n" + line + b"\r\n"] = size


# Plain CRLF-terminated size lines seen, and their sizes: as the fast path slices them at the
# first chunk of a run (up to the LF) and at each next one (the CRLF after the data too).
# Apart, so that neither form can stand for the other.
_LINES: dict[bytes, int] = {}
_FRAMES: dict[bytes, int] = {}
