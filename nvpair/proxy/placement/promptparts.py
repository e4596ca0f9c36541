"""A prompt's parts in the order an engine renders them (spec §11 "Conversation affinity"):
what ``keys`` chains into a request's digests.

* Chat routes: each message of ``messages``.
* Anthropic Messages (``/v1/messages``): ``system`` (a string or text blocks), ``tools``, then
  each message of ``messages`` (a string or content blocks: text, tool_use, tool_result,
  images...).
* OpenAI Responses (``/v1/responses``): ``instructions``, ``tools``, then ``input``: a string
  (one user turn) or each of its items (messages, function_call, function_call_output,
  reasoning...).

Agents of one app share a system prompt and tools, so they share leading parts; each turn
of a conversation repeats the parts of the last and adds its own.  Each part is a hashable
value made of digests and the characters of content it stands for.  A message that is a
role and a text (also a single text block, Anthropic's or Responses' shape, so the same
turn keys alike whichever shape a client sends it in) is the tuple ``(role, text)``, hashed
without a copy; anything else is a digest of its JSON value with object members in name
order, where strings are hashed as they are (no copy, no encoding: an image is the digest
of its data, never the data) and ``cache_control`` is left out (Anthropic clients move
that marker to the newest message each turn, and it changes nothing an engine renders).
An image or file block counts ``IMAGE_CHARS`` characters, whatever its data's size.
"""

from __future__ import annotations

__all__ = [
    "IMAGE_CHARS",
    "MAX_DEPTH",
    "MAX_PARTS",
    "Part",
    "TooDeep",
    "chatParts",
    "digestOf",
    "messagePart",
    "messagesParts",
    "responsesParts",
]

MAX_DEPTH = 32  # a value nested deeper gets the request no key
IMAGE_CHARS = 4096  # what an image or file block counts for (about 1k tokens)
MAX_PARTS = 4096  # a prompt of more parts (messages, items) gets no key

Part = tuple[object, int]  # (hashable value, characters of content)

_LEFT_OUT = "cache_control"
_TEXT_TYPES = frozenset(("text", "input_text", "output_text"))
_IMAGE_TYPES = frozenset(("image", "image_url", "input_image", "document", "file", "input_file"))
_PLAIN_KEYS = frozenset(("role", "content", "type", _LEFT_OUT))
_LABELS = frozenset(("role", "type"))  # members whose text is no content


class TooDeep(Exception):
    """A value nested deeper than ``MAX_DEPTH``: the request gets no key."""


def chatParts(doc: dict[str, object]) -> list[Part] | None:
    """A chat request's parts: its messages (None when it has no usable list)."""
    return _listed(doc.get("messages"), [])


def messagesParts(doc: dict[str, object]) -> list[Part] | None:
    """An Anthropic Messages request's parts: ``system``, ``tools``, its messages."""
    return _listed(doc.get("messages"), _leading(doc, "system"))


def responsesParts(doc: dict[str, object]) -> list[Part] | None:
    """An OpenAI Responses request's parts: ``instructions``, ``tools``, its input."""
    parts = _leading(doc, "instructions")
    source = doc.get("input")
    if type(source) is str:
        parts.append((("user", source), len(source)))
        return parts
    return _listed(source, parts)


def _leading(doc: dict[str, object], name: str) -> list[Part]:
    """The system text (``name``) and the tools, where the request has them."""
    parts: list[Part] = []
    for field in (name, "tools"):
        value = doc.get(field)
        if value is not None:
            digest, chars = digestOf(value)
            parts.append(((field, digest), chars))
    return parts


def _listed(items: object, parts: list[Part]) -> list[Part] | None:
    if type(items) is not list or not items or len(items) + len(parts) > MAX_PARTS:
        return None
    for item in items:
        parts.append(messagePart(item))
    return parts


def messagePart(message: object) -> Part:
    """One message's (or input item's) part."""
    if type(message) is dict and message.keys() <= _PLAIN_KEYS:
        role = message.get("role")
        text = _text(message.get("content"))
        kind = message.get("type", "message")
        if type(role) is str and text is not None and kind == "message":
            return (role, text), len(text)  # the common shape: hashed without a copy
    return digestOf(message)


def _text(content: object) -> str | None:
    """A content that is one text: a string, or a list of one text block."""
    if type(content) is str:
        return content
    if type(content) is list and len(content) == 1:
        block = content[0]
        if type(block) is dict and block.keys() <= {"type", "text", _LEFT_OUT}:
            kind, text = block.get("type"), block.get("text")
            if type(kind) is str and kind in _TEXT_TYPES and type(text) is str:
                return text
    return None


def digestOf(value: object, depth: int = 0) -> tuple[int, int]:
    """(digest, characters of string content) of a JSON value, members in name order,
    ``cache_control`` left out (``role`` and ``type`` labels count no characters); raises
    ``TooDeep`` past ``MAX_DEPTH`` levels."""
    if type(value) is str:
        return hash(value), len(value)
    if type(value) is dict:
        if depth >= MAX_DEPTH:
            raise TooDeep()
        members: list[tuple[str, int]] = []
        chars = 0
        for name, member in value.items():
            if type(member) is str:  # most members: no call
                members.append((name, hash(member)))
                if name not in _LABELS:
                    chars += len(member)
            elif name != _LEFT_OUT:
                digest, size = digestOf(member, depth + 1)
                members.append((name, digest))
                chars += size
        members.sort()
        block = value.get("type")
        if type(block) is str and block in _IMAGE_TYPES:
            chars = IMAGE_CHARS
        return hash(("{", tuple(members))), chars
    if type(value) is list:
        if depth >= MAX_DEPTH:
            raise TooDeep()
        digests: list[int] = []
        chars = 0
        for item in value:
            if type(item) is str:
                digests.append(hash(item))
                chars += len(item)
            else:
                digest, size = digestOf(item, depth + 1)
                digests.append(digest)
                chars += size
        return hash(("[", tuple(digests))), chars
    return hash((type(value).__name__, value)), 0
