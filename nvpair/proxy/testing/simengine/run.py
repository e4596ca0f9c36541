"""One inference request inside the simulated engine: wait for its model, a slot, prefill, decode.

Timeline: a request for a model not loaded first waits for it to load (``residency``: one
load at a time, idle models evicted), holding the model from then on; then it waits for a
slot; once it has one, the leading prompt blocks held in the prefix cache are free; every
other prompt token costs ``prefillMs``; then the prompt's blocks are cached and (streaming)
the headers go out; the i-th token goes out ``(i + 1) * decodeMs`` later. When the last
token is out, the blocks of prompt and answer together are cached (the next turn of the
conversation starts with exactly those tokens), the usage is reported as the dialect does
(Ollama's ``load_duration``: the wait for the model), and the slot goes to the next request
in the FIFO.  Every answer carries ``X-Sim-Queue-Ms``: how long the request waited in the
engine's FIFO for its slot (no real engine says so; benchmarks tell a wait in the engine
from one in front of it by it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zope.interface import implementer

from nvpair.proxy.testing.fakeengine.answers import JSON
from nvpair.proxy.testing.fakeengine.connection import EngineConnection, chunk
from nvpair.proxy.testing.simengine.core import Core, IRun
from nvpair.proxy.testing.simengine.replies import Replier, Usage
from nvpair.proxy.testing.simengine.slots import Job
from nvpair.proxy.testing.simengine.tokens import blockDigests, outputWord, tokenId


@implementer(IRun)
class Run:
    """One inference request, from its arrival to its last byte (or its client leaving)."""

    def __init__(
        self,
        core: Core,
        connection: EngineConnection,
        reply: Replier,
        stream: bool,
        words: Sequence[str],
        maxTokens: int,
        onDone: Callable[[Run], None],
        served: str = "",
    ) -> None:
        self._parts = core
        self._connection = connection
        self._reply = reply
        self._stream = stream
        self._ids = [tokenId(w) for w in words]
        self._n = maxTokens
        self._onDone = onDone
        self._served = served or reply.model
        self._digests = blockDigests(reply.model, self._ids, core.config.blockSize)
        self._slots = core.slotsFor(self._served)
        self.job = Job(self._start)
        self.cached = 0
        self.done = False
        self.taskId = -1
        self.loadSeconds = 0.0  # waited for the model to load
        self._giveUp: Callable[[], None] | None = None
        self._holding = False

    @property
    def promptTokens(self) -> int:
        """How many tokens the prompt has."""
        return len(self._ids)

    def begin(self) -> bool:
        """Wait for the model, then take a slot or a place in the FIFO; False when the FIFO
        is full (checked on arrival)."""
        if not self._slots.accepts():
            return False
        self._giveUp = self._parts.residency.want(self._served, self._ready)
        return True

    def _ready(self, waited: float) -> None:
        self._giveUp = None
        self.loadSeconds = waited
        self._parts.residency.hold(self._served)
        self._holding = True
        self._slots.submit(self.job, bounded=False)

    def _letGo(self) -> None:
        if self._giveUp is not None:
            self._giveUp()
            self._giveUp = None
        if self._holding:
            self._holding = False
            self._parts.residency.release(self._served)

    def cancel(self) -> None:
        """The client went away: give up the model, the slot or the place in the FIFO."""
        if not self.done:
            self.done = True
            self._parts.stats.cancelled += 1
            self._slots.release(self.job)
            self._letGo()

    def _start(self, slotId: int) -> None:
        parts = self._parts
        size = parts.config.blockSize
        matched = parts.cache.match(self._digests)
        self.cached = max(0, min(matched * size, len(self._ids) - 1))
        evaluated = len(self._ids) - self.cached
        self._promptMs = evaluated * parts.config.prefillMs
        stats = parts.stats
        stats.promptTokens += len(self._ids)
        stats.cachedTokens += self.cached
        stats.promptSeconds += self._promptMs / 1000.0
        self._connection.later(self._promptMs / 1000.0, self._prefilled)

    def _prefilled(self) -> None:
        self._parts.cache.insert(self._digests)
        decode = self._parts.config.decodeMs / 1000.0
        if not self._stream:
            self._connection.later(decode * self._n, self._finish)
            return
        head = self._parts.responder.head(200, self._waited(), self._reply.contentType, None)
        first = self._reply.first(Usage(len(self._ids), self.cached, 0, self._promptMs, 0.0))
        self._connection.write(head + (chunk(first) if first else b""))
        self._connection.later(decode, lambda: self._token(0))

    def _token(self, i: int) -> None:
        text = outputWord(i) if i == 0 else " " + outputWord(i)
        self._connection.write(chunk(self._reply.piece(text)))
        if i + 1 < self._n:
            decode = self._parts.config.decodeMs / 1000.0
            self._connection.later(decode, lambda: self._token(i + 1))
        else:
            self._finish()

    def _finish(self) -> None:
        parts = self._parts
        n = self._n
        answer = [tokenId(outputWord(i)) for i in range(n)]
        parts.cache.insert(
            blockDigests(self._reply.model, self._ids + answer, parts.config.blockSize)
        )
        predictedMs = n * parts.config.decodeMs
        usage = Usage(
            len(self._ids), self.cached, n, self._promptMs, predictedMs, self.loadSeconds * 1000
        )
        stats = parts.stats
        stats.completed += 1
        stats.completionTokens += n
        stats.predictedSeconds += predictedMs / 1000.0
        stats.decodes += n
        self.done = True
        self._slots.release(self.job)
        self._letGo()
        self._onDone(self)
        if self._stream:
            self._connection.write(chunk(self._reply.last(usage)) + b"0\r\n\r\n")
            self._connection.finished()
        else:
            text = " ".join(outputWord(i) for i in range(n))
            body = self._reply.document(text, usage)
            parts.responder.sendDocument(self._connection, 200, self._waited(), body, JSON)

    def _waited(self) -> dict[str, str]:
        return {"X-Sim-Queue-Ms": f"{self.job.waited * 1000:.1f}"}
