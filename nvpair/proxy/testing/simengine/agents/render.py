"""How the simulated engine templates a Messages or a Responses request into tokens (spec §16),
in the order a real engine renders them, so that the prefix cache works across turns.

* Messages: ``<|system|>`` and the system prompt (a string or text blocks), ``<|tools|>``
  and each tool definition, then per message ``<|role|>`` and its content (a string, or
  blocks: text, thinking, ``<|tool_use|>`` with the tool's name and input,
  ``<|tool_result|>`` with its content; an image or document is one token naming a digest
  of its source), then ``<|assistant|>``.
* Responses: ``<|system|>`` and ``instructions``, ``<|tools|>`` and each tool, then
  ``input`` (a string is one user message; items are messages with their text parts, and
  ``<|function_call|>``, ``<|function_call_output|>``, ``<|reasoning|>`` items), then
  ``<|assistant|>``.  A follow-up (``previous_response_id``) starts with the stored
  conversation instead of its own instructions and tools.

The answer is ``tok0 tok1 ...``, so an assistant message holding a previous answer renders
exactly as that turn's prompt followed by its answer did: the next turn finds them cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from nvpair.proxy.testing.simengine.tokens import words


def marker(name: object) -> str:
    """A role or part marker token (``<|user|>``), whitespace removed."""
    text = name if isinstance(name, str) else "user"
    return "<|" + "".join(text.split()) + "|>"


def digestToken(kind: str, source: object) -> str:
    """One token standing for an image or a document: a digest of its source."""
    data = json.dumps(source, sort_keys=True, default=str).encode("utf-8", "surrogatepass")
    return f"<|{kind}:{hashlib.blake2b(data, digest_size=8).hexdigest()}|>"


def jsonWords(value: object) -> list[str]:
    """The tokens of a JSON value (a tool definition, a tool call's input)."""
    return words(json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str))


def partWords(part: object) -> list[str]:
    """The tokens of one content block or part, whatever the API calls it."""
    if isinstance(part, str):
        return words(part)
    if not isinstance(part, Mapping):
        return []
    kind = part.get("type")
    if kind in ("image", "input_image", "document", "input_file"):
        source = part.get("source", part.get("image_url", part.get("file_id")))
        return [digestToken("image" if "image" in str(kind) else "document", source)]
    if kind == "tool_use":
        return [
            marker("tool_use"),
            *words(str(part.get("name", ""))),
            *jsonWords(part.get("input")),
        ]
    if kind == "tool_result":
        return [marker("tool_result"), *contentWords(part.get("content"))]
    for field in ("text", "thinking"):
        value = part.get(field)
        if isinstance(value, str):
            return words(value)
    return []


def contentWords(content: object) -> list[str]:
    """The tokens of a message's content: a string, or a list of blocks or parts."""
    if isinstance(content, str):
        return words(content)
    if isinstance(content, list):
        return [w for part in content for w in partWords(part)]
    return []


def toolsWords(tools: object) -> list[str]:
    """``<|tools|>`` and each tool definition, when there are any."""
    if not isinstance(tools, list) or not tools:
        return []
    return [marker("tools"), *(w for tool in tools for w in jsonWords(tool))]


def messagesWords(doc: Mapping[str, object]) -> list[str] | None:
    """A Messages request's prompt tokens, or None without a ``messages`` list."""
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return None
    out: list[str] = []
    system = doc.get("system")
    if system:
        out += [marker("system"), *contentWords(system)]
    out += toolsWords(doc.get("tools"))
    for message in messages:
        if isinstance(message, Mapping):
            out += [marker(message.get("role")), *contentWords(message.get("content"))]
    out.append(marker("assistant"))
    return out


def itemWords(item: object) -> list[str]:
    """The tokens of one Responses input item."""
    if isinstance(item, str):
        return [marker("user"), *words(item)]
    if not isinstance(item, Mapping):
        return []
    kind = item.get("type", "message")
    if kind == "message":
        return [marker(item.get("role")), *contentWords(item.get("content"))]
    if kind == "function_call":
        name = str(item.get("name", ""))
        return [marker(kind), *words(name), *words(str(item.get("arguments", "")))]
    if kind == "function_call_output":
        return [marker(kind), *contentWords(item.get("output"))]
    if kind == "reasoning":
        return [marker(kind), *contentWords(item.get("summary"))]
    return [marker(str(kind)), *contentWords(item.get("content"))]


def responsesWords(
    doc: Mapping[str, object], conversation: list[str] | None = None
) -> list[str] | None:
    """A Responses request's prompt tokens (after ``conversation``, a stored one, when it
    follows up), or None without an ``input``."""
    given = doc.get("input")
    if isinstance(given, str):
        items: list[object] = [given]
    elif isinstance(given, list):
        items = given
    else:
        return None
    if conversation is not None:
        out = list(conversation)
    else:
        out = []
        instructions = doc.get("instructions")
        if isinstance(instructions, str) and instructions:
            out += [marker("system"), *words(instructions)]
        out += toolsWords(doc.get("tools"))
    for item in items:
        out += itemWords(item)
    out.append(marker("assistant"))
    return out
