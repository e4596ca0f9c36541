"""A request's prompt as digests (spec §11 "Conversation affinity", "The prefix index"):
what placement by cache looks up, records and spreads by.

Each inference request on a chat, completion, generate, Messages or Responses route gets an
``AffinityKey``: digests of the model and of successive leading parts of its prompt (the
chained digests of its parts, ``promptparts``, on chat, Messages and Responses routes; for
prompt text the whole text and its prefixes of 256·2^k characters).  A later turn, whose
parts extend an earlier turn's, finds among its prefix digests the earlier turn's
whole-request digest.  The prompt's chained block digests, with where each block ends
(characters), are what the prefix index matches.

Every digest is seeded with the request's *scope* (spec §11 "Scopes"): the digest of its
``Authorization`` value, so requests with different keys never match each other's
prefixes; requests without one, or every request where the fleet file shares prefixes,
share one scope.  An OpenAI ``prompt_cache_key`` adds a digest looked up first and recorded
with the rest: requests carrying the same hint are placed together, and spread by it.

Digests are Python's per-process keyed ``hash`` of tuples of the strings (SipHash of each
string, no copy or encoding of the text): a collision can only misplace a request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from nvpair.proxy.placement.prefixindex import MAX_BLOCKS
from nvpair.proxy.placement.promptparts import (
    MAX_PARTS,
    Part,
    TooDeep,
    chatParts,
    messagesParts,
    responsesParts,
)

__all__ = ["AffinityKey", "keyFor", "scopeOf"]

MAX_LOOKUPS = 8  # the longest part-list prefixes looked up per request
MAX_MESSAGES = MAX_PARTS  # a longer message list gets no key
PROMPT_BLOCK = 256  # prompt prefixes are taken at 256·2^k characters
MAX_HINT = 256  # a longer ``prompt_cache_key`` is no hint

PROMPT = "prompt"
PARTS: dict[str, Callable[[dict[str, object]], list[Part] | None]] = {
    "chat": chatParts,
    "messages": messagesParts,
    "responses": responsesParts,
}
ROUTES: dict[bytes, str] = {
    b"/v1/chat/completions": "chat",
    b"/api/chat": "chat",
    b"/api/v0/chat/completions": "chat",
    b"/v1/completions": PROMPT,
    b"/api/generate": PROMPT,
    b"/api/v0/completions": PROMPT,
    b"/v1/messages": "messages",
    b"/v1/responses": "responses",
}


class AffinityKey:
    """One request's digests: looked up (longest first), recorded at commit, spread by; its
    prompt's chained block digests with where each block ends (characters) for the prefix
    index, what placement expected of the node it chose (node, matched blocks, index
    stamp) until the engine confirms a hit or a miss, where its blocks were recorded when
    placed (and their stamp), which of them names its prompt family (None: none),
    whether the engine's cached count may confirm anything (not when the client asked for
    no cache reuse), and whether the client named its group (``prompt_cache_key``, a
    session header: its home then counts however short its prompt)."""

    __slots__ = (
        *("lookups", "records", "spread", "blocks", "ends"),
        *("expect", "placed", "stamp", "root", "confirms", "hinted"),
    )

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
        self.stamp = 0  # the index stamp of that record
        self.root: int | None = None
        self.confirms = True
        self.hinted = False

    @property
    def chars(self) -> int:
        """The characters of prompt material the blocks cover."""
        return self.ends[-1] if self.ends else 0


@functools.lru_cache(maxsize=MAX_MESSAGES)
def _marks(count: int) -> tuple[int, ...]:
    """Which part-list prefixes of a list of ``count`` parts are prefix-index blocks: the
    first four (system prompt, tools, shared documents), those of 2^k parts, and the last
    two turns' ends (so a later turn finds the earlier turn's whole prompt)."""
    marks = {i for i in range(min(count, 4))} | {count - 1}
    length = 8
    while length <= count:
        marks.add(length - 1)
        length *= 2
    if count >= 3:
        marks.add(count - 3)
    return tuple(sorted(marks))[:MAX_BLOCKS]


def _chainKey(seed: int, parts: list[Part]) -> AffinityKey:
    digest = seed
    digests: list[int] = []
    ends: list[int] = []
    addDigest, addEnd = digests.append, ends.append
    size = 0
    for part, chars in parts:  # chained: one digest per part-list prefix
        digest = hash((digest, part))
        size += chars
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


def scopeOf(authorization: bytes | None, shared: bool) -> int | None:
    """The prefix scope of a request with this ``Authorization`` value: its digest, or None
    (one scope) without a value or where the fleet file shares prefixes across keys."""
    if shared or not authorization:
        return None
    return hash((b"nvpair-scope", authorization))


def keyFor(
    engineId: str,
    model: str,
    path: bytes,
    doc: object,
    scope: int | None = None,
    session: bytes | None = None,
) -> AffinityKey | None:
    """The affinity key of a request on ``path`` with the parsed JSON body ``doc`` in
    ``scope`` (``scopeOf``), if any; ``session`` is an agent CLI's session header, a hint
    looked up last (after the prompt's own digests) and recorded."""
    kind = ROUTES.get(path)
    if kind is None or type(doc) is not dict:
        return None
    seed = hash(("nvpair-affinity", engineId, model, scope))
    try:
        key = _keyOf(kind, seed, doc)
    except TooDeep:
        key = None
    hint = doc.get("prompt_cache_key")
    if type(hint) is str and 0 < len(hint) <= MAX_HINT:
        grouped = hash((seed, "prompt_cache_key", hint))
        if key is None:
            key = AffinityKey((grouped,), (grouped,))
        else:
            key.lookups = (grouped, *key.lookups)
            key.records = (grouped, *key.records)
            key.spread = grouped
        key.hinted = True
    if key is not None and session is not None and 0 < len(session) <= MAX_HINT:
        together = hash((seed, "session", session))
        key.lookups = (*key.lookups, together)
        key.records = (*key.records, together)
        key.hinted = True
    if key is not None and doc.get("cache_prompt") is False:
        key.confirms = False
    return key


def _keyOf(kind: str, seed: int, doc: dict[str, object]) -> AffinityKey | None:
    parts = PARTS.get(kind)
    if parts is not None:
        found = parts(doc)
        return None if not found else _chainKey(seed, found)
    prompt = doc.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    system = doc.get("system")
    if type(system) is str:
        seed = hash((seed, system))
    return _promptKey(seed, prompt) if type(prompt) is str else None
