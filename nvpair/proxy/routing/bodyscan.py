"""A bounded scan of a large JSON object body for its top-level members (spec §5 "Bodies").

A body too large to parse on the reactor (``admission.PARSE_LIMIT``) is read only in two
windows of its raw bytes: the first ``WINDOW`` bytes and the last ``WINDOW``.  Clients put
the fields routing needs either first (curl, Codex, most hand-written clients) or after the
prompt (the official Python SDKs serialize ``messages`` or ``input`` before ``model``), so
those two windows hold them; a member lying partly outside both is not seen.

* **Front.** From the opening ``{``, members are decoded one after another
  (``JSONDecoder.raw_decode``, C speed) while each lies wholly within the window.
* **Back.** Scanning the reversed window backwards from the final ``}`` (strings matched by a
  regular expression, C speed), the earliest comma between two top-level members is found;
  every member after it is then decoded forwards.  In valid JSON every unescaped quote is a
  string's edge, so the scan never mistakes a string's content, or a nested member, for a
  top-level one; a window edge that falls inside a string or an escape ends the scan there.

Either scan costs at most one window's work, whatever the body; a member found in both
windows, or twice, counts at its later place (as ``json.loads`` keeps the last of duplicate
names).  A body that is not UTF-8 JSON there finds nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

__all__ = ["WINDOW", "leadingMembers", "scanMembers"]

WINDOW = 256 * 1024  # bytes read at each end of a body

_decoder = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_BLANKS = re.compile(rb"[ \t\n\r]*")
# Tokens of the reversed window, by group: a reversed string (its inner quotes are followed
# by the backslash that escaped them; its first quote, the string's real end, must be
# followed by a character that is not one, so a string cut by the window's edge never
# matches), closing brackets, opening brackets, anything else (commas, colons, blanks,
# numbers, literals), and a quote no string matched.
_REVERSED = re.compile(rb'("[^"]*(?:"(?=\\)[^"]*)*"(?=[^\\]))|([\]}]+)|([\[{]+)|([^"\[\]{}]+)|(")')
_CLOSE, _OPEN, _OTHER, _CUT = 2, 3, 4, 5


def scanMembers(
    body: bytes, names: Collection[str], window: int = WINDOW
) -> dict[str, object] | None:
    """The top-level members named in ``names`` that lie wholly within the first or the last
    ``window`` bytes of the JSON object ``body``, decoded; None when ``body`` does not
    begin as a JSON object."""
    start = _BLANKS.match(body).end()  # type: ignore[union-attr]
    if body[start : start + 1] != b"{":
        return None
    found: dict[str, object] = {}
    if _leading(body, start, window, names, found):
        return found  # the whole object lay within the front window
    if len(body) - window > start:
        found.update(_back(body, window, names))
    return found


def leadingMembers(data: bytes, names: Collection[str]) -> dict[str, object] | None:
    """The top-level members named in ``names`` among the leading complete members of
    ``data``, the start of a JSON object (the rest may not have arrived yet); None when
    ``data`` does not begin as one."""
    start = _BLANKS.match(data).end()  # type: ignore[union-attr]
    if data[start : start + 1] != b"{":
        return None
    found: dict[str, object] = {}
    _leading(data, start, len(data), names, found)
    return found


def _leading(
    body: bytes, start: int, window: int, names: Collection[str], found: dict[str, object]
) -> bool:
    """Decode the members within ``window`` bytes after the brace at ``start`` into
    ``found``; True when the object's closing brace lay within them too."""
    text = _front(body, start + 1, window)
    if text is None:
        return False
    at = _SPACE.match(text).end()  # type: ignore[union-attr]
    return text.startswith("}", at) or _members(text, at, names, found) >= 0


def _front(body: bytes, start: int, window: int) -> str | None:
    """The front window after the opening brace as text, cut at a character boundary."""
    end = min(len(body), start + window)
    if end < len(body):
        while end > start and 0x80 <= body[end] < 0xC0:
            end -= 1  # not inside a UTF-8 character
    try:
        return body[start:end].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


def _members(text: str, at: int, names: Collection[str], found: dict[str, object]) -> int:
    """Decode the members from ``at`` (a member's name) on into ``found`` (those named in
    ``names``); the offset of the object's closing brace, or -1 where the members end
    otherwise (the window's edge, or not JSON)."""
    space = _SPACE.match
    decode = _decoder.raw_decode
    try:
        while text.startswith('"', at):
            name, at = decode(text, at)
            at = space(text, at).end()  # type: ignore[union-attr]
            if not text.startswith(":", at):
                return -1
            at = space(text, at + 1).end()  # type: ignore[union-attr]
            value, at = decode(text, at)
            at = space(text, at).end()  # type: ignore[union-attr]
            end = text.startswith("}", at)
            if not end and not text.startswith(",", at):
                return -1  # a number may go on past the window's edge: not taken
            if name in names:
                found[name] = value
            if end:
                return at
            at = space(text, at + 1).end()  # type: ignore[union-attr]
    except (ValueError, RecursionError):
        pass  # cut by the window's edge, or not JSON
    return -1


def _back(body: bytes, window: int, names: Collection[str]) -> dict[str, object]:
    """The named members after the earliest top-level comma in the last ``window`` bytes."""
    begin = max(0, len(body) - window)
    while begin < len(body) and 0x80 <= body[begin] < 0xC0:
        begin += 1  # not inside a UTF-8 character
    last = body[begin:].rstrip(b" \t\n\r")  # the window (a copy of at most its size)
    if not last.endswith(b"}"):
        return {}
    tail = last[-2::-1]  # reversed, without the closing brace
    depth = 0
    cut: int | None = None  # offset in ``tail`` of the earliest top-level comma seen
    for match in _REVERSED.finditer(tail):
        kind = match.lastindex
        if kind == _OTHER:
            if depth == 0:
                comma = tail.rfind(b",", match.start(), match.end())
                if comma >= 0:
                    cut = comma
        elif kind == _CLOSE:
            depth += match.end() - match.start()
        elif kind == _OPEN:
            depth -= match.end() - match.start()
            if depth < 0:
                break  # the opening brace: the whole object lay in the window
        elif kind == _CUT:
            break  # a string cut by the window's edge, or not JSON
    if cut is None:
        return {}
    try:
        text = last[len(last) - 1 - cut :].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return {}
    found: dict[str, object] = {}
    at = _SPACE.match(text).end()  # type: ignore[union-attr]
    return found if _members(text, at, names, found) == len(text) - 1 else {}
