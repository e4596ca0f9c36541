"""A request's prompt as digests (spec §11 "Conversation affinity", "The prefix index"):
what placement by cache looks up, records and spreads by.

Each inference request on a chat, completion or generate route gets an ``AffinityKey``:
digests of the model and of successive leading parts of its prompt (message-list prefixes
for chat routes; for prompt text the whole text and its prefixes of 256·2^k characters).  A
later turn, whose messages extend an earlier turn's, finds among its prefix digests the
earlier turn's whole-request digest.  The prompt's chained block digests, with where each
block ends (characters), are what the prefix index matches.

Digests are Python's per-process keyed ``hash`` of tuples of the strings (SipHash of each
string, no copy or encoding of the text): a collision can only misplace a request.
"""

from __future__ import annotations

import functools
import json

from nvpair.proxy.placement.prefixindex import MAX_BLOCKS

__all__ = ["AffinityKey", "keyFor"]

MAX_LOOKUPS = 8  # the longest message-list prefixes looked up per request
MAX_MESSAGES = 4096  # a longer message list gets no key
PROMPT_BLOCK = 256  # prompt prefixes are taken at 256·2^k characters

CHAT, PROMPT, RESPONSES = "chat", "prompt", "responses"
ROUTES: dict[bytes, str] = {
    b"/v1/chat/completions": CHAT,
    b"/api/chat": CHAT,
    b"/api/v0/chat/completions": CHAT,
    b"/v1/completions": PROMPT,
    b"/api/generate": PROMPT,
    b"/api/v0/completions": PROMPT,
    b"/v1/responses": RESPONSES,
}


class AffinityKey:
    """One request's digests: looked up (longest first), recorded at commit, spread by; its
    prompt's chained block digests with where each block ends (characters) for the prefix
    index, what placement expected of the node it chose (node, matched blocks, index
    stamp) until the engine confirms a hit or a miss, where its blocks were recorded when
    placed, and which of them names its prompt family (None: none)."""

    __slots__ = ("lookups", "records", "spread", "blocks", "ends", "expect", "placed", "root")

    def __init__(
        self,
        lookups: tuple[int, ...],
        records: tuple[int, ...],
        blocks: tuple[int, ...] = (),
        ends: tuple[int, ...] = (),
    ) -> None:
        self.lookups = lookups
        self.records = records
        self.spread = records[0]
        self.blocks = blocks
        self.ends = ends
        self.expect: tuple[str, int, int] | None = None
        self.placed: str | None = None  # the node its blocks were recorded on when placed
        self.root: int | None = None

    @property
    def chars(self) -> int:
        """The characters of prompt material the blocks cover."""
        return self.ends[-1] if self.ends else 0


def _messagePart(message: object) -> object:
    if type(message) is dict and len(message) == 2:
        role = message.get("role")
        content = message.get("content")
        if type(role) is str and type(content) is str:
            return (role, content)  # the common shape: hashed without serializing
    return json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@functools.lru_cache(maxsize=MAX_MESSAGES)
def _marks(count: int) -> tuple[int, ...]:
    """Which message prefixes of a list of ``count`` messages are prefix-index blocks: the
    first four (system prompt, shared documents), those of 2^k messages, and the last two
    turns' ends (so a later turn finds the earlier turn's whole prompt)."""
    marks = {i for i in range(min(count, 4))} | {count - 1}
    length = 8
    while length <= count:
        marks.add(length - 1)
        length *= 2
    if count >= 3:
        marks.add(count - 3)
    return tuple(sorted(marks))[:MAX_BLOCKS]


def _chatKey(seed: int, messages: object) -> AffinityKey | None:
    if type(messages) is not list or not messages or len(messages) > MAX_MESSAGES:
        return None
    digest = seed
    digests: list[int] = []
    ends: list[int] = []
    addDigest, addEnd = digests.append, ends.append
    size = 0
    for message in messages:  # chained: one digest per message prefix
        part = _messagePart(message)
        digest = hash((digest, part))
        size += len(part[1]) if type(part) is tuple else len(part)  # type: ignore[arg-type]
        addDigest(digest)
        addEnd(size)
    marks = _marks(len(digests))
    return AffinityKey(
        tuple(digests[: -MAX_LOOKUPS - 1 : -1]),
        (digest,),
        tuple([digests[i] for i in marks]),
        tuple([ends[i] for i in marks]),
    )


def _promptKey(seed: int, prompt: str) -> AffinityKey | None:
    if not prompt:
        return None
    whole = hash((seed, prompt))
    aligned: list[int] = []
    lengths: list[int] = []
    length = PROMPT_BLOCK
    while length <= len(prompt):  # every slice together copies under twice the prompt
        aligned.append(hash((seed, prompt[:length])))
        lengths.append(length)
        length *= 2
    blocks, ends = list(aligned), list(lengths)  # the prefixes, then the whole text
    if not lengths or lengths[-1] != len(prompt):
        blocks.append(whole)
        ends.append(len(prompt))
    aligned.reverse()
    records = (whole, aligned[0]) if aligned else (whole,)
    return AffinityKey((whole, *aligned[: MAX_LOOKUPS - 1]), records, tuple(blocks), tuple(ends))


def keyFor(engineId: str, model: str, path: bytes, doc: object) -> AffinityKey | None:
    """The affinity key of a request on ``path`` with the parsed JSON body ``doc``, if any."""
    kind = ROUTES.get(path)
    if kind is None or type(doc) is not dict:
        return None
    return _keyOf(kind, hash(("nvpair-affinity", engineId, model)), doc)


def _keyOf(kind: str, seed: int, doc: dict[str, object]) -> AffinityKey | None:
    if kind == CHAT:
        return _chatKey(seed, doc.get("messages"))
    if kind == RESPONSES:
        source = doc.get("input")
        instructions = doc.get("instructions")
        if type(instructions) is str:
            seed = hash((seed, instructions))
        return (
            _chatKey(seed, source)
            if type(source) is list
            else (_promptKey(seed, source) if type(source) is str else None)
        )
    prompt = doc.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    system = doc.get("system")
    if type(system) is str:
        seed = hash((seed, system))
    return _promptKey(seed, prompt) if type(prompt) is str else None
