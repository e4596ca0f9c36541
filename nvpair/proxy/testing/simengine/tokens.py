"""The simulated engine's tokenizer and prompt template: deterministic, cheap, documented.

A *token* is a whitespace-separated word (``str.split()``): a 1,500-word system prompt is
1,500 tokens. A token's id is the CRC-32 of its UTF-8 bytes modulo ``VOCAB`` (the same in
every process, unlike ``hash``). A chat prompt is templated as, per message, a role marker
token ``<|role|>`` followed by the words of its content, then the generation marker
``<|assistant|>``; so a conversation's next turn starts with exactly the tokens of the
previous prompt followed by the previous answer's words, and finds them cached.

The prefix cache works in blocks of ``blockSize`` token ids; block *i*'s digest covers the
model and every token before the end of block *i* (chained BLAKE2b, 8 bytes), so two
prompts share a cached block only if they agree on everything up to it. Only full blocks
are digested.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence

VOCAB = 32000
MAX_WORDS = 1 << 20
"""A prompt of more words than this is refused (413): every prompt is bounded."""


def words(text: str) -> list[str]:
    """The tokens of ``text``: its whitespace-separated words."""
    return text.split()


def tokenId(word: str) -> int:
    """The deterministic id of a token."""
    return zlib.crc32(word.encode("utf-8", "surrogatepass")) % VOCAB


def textOf(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    return ""


def chatWords(messages: Sequence[object]) -> list[str]:
    """The templated tokens of a chat: per message its role marker and content words, then
    the generation marker."""
    out: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        out.append(f"<|{role if isinstance(role, str) else 'user'}|>")
        out.extend(words(textOf(message.get("content"))))
    out.append("<|assistant|>")
    return out


def promptWords(doc: Mapping[str, object], chat: bool) -> list[str] | None:
    """The prompt tokens of a request document, or None when it has no usable prompt.

    Chat routes read ``messages`` (Ollama's ``/api/chat`` too); completion routes read
    ``prompt`` (a string, or a list of strings joined by spaces), with Ollama's ``system``
    first.
    """
    if chat:
        messages = doc.get("messages")
        if not isinstance(messages, list):
            return None
        return chatWords(messages)
    prompt = doc.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    if not isinstance(prompt, str):
        return None
    system = doc.get("system")
    head = words(system) if isinstance(system, str) else []
    return head + words(prompt)


def outputWord(i: int) -> str:
    """The i-th token the engine generates."""
    return f"tok{i}"


def outputText(n: int) -> str:
    """The whole answer of ``n`` generated tokens (words joined by spaces)."""
    return " ".join(outputWord(i) for i in range(n))


def blockDigests(model: str, ids: Sequence[int], blockSize: int) -> list[bytes]:
    """The chained digests of every full block of ``ids`` (block i covers ids[: (i+1)*size])."""
    digests: list[bytes] = []
    previous = hashlib.blake2b(model.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    for start in range(0, len(ids) - blockSize + 1, blockSize):
        block = b"".join(i.to_bytes(2, "little") for i in ids[start : start + blockSize])
        previous = hashlib.blake2b(previous + block, digest_size=8).digest()
        digests.append(previous)
    return digests
