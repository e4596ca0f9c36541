"""Moving a request that waits in an engine's own queue before its first token (spec §11,
"Moved before its first token"; standalone mode).

The ledger sends a request where a slot looks free, but a client that reaches the engine
directly can take that slot between the engine's report and the request's arrival: the
request then waits inside the engine, behind a generation the proxy cannot see, while
another owner may have a slot free.  Nothing on the wire says so but time: a streamed
answer's first token comes one prefill after it is sent.  So the first attempt of each
streamed inference request sent where the node's reported slots had room for it is
watched (one sent to wait at a full node on purpose, for its cached prefix, is not).  Past its
*first-token budget* (``FLOOR`` plus ``PREFILL_FACTOR`` times the prompt's estimated
prefill there), the first check that finds another owner of the model with a free slot
moves it: the node's foreign load is raised by one (the slot it counted free is taken), the
attempt is given up before any content (its connection closes, which takes the request off
the engine's queue), and the request is placed again at once.  Only first attempts are
watched, so a request moves at most once.

One timer for the process, every ``STEP`` seconds while any attempt is watched, as for the
stream idle watches: a request costs an entry added and removed, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.flow.interfaces import IEngineQueues, IMovable
from nvpair.proxy.nodestate.interfaces import (
    IEngineStates,
    IResidency,
    IRoomLedger,
    ModelState,
)
from nvpair.proxy.placement.choose import CHARS_PER_TOKEN, DEFAULT_MS_PER_TOKEN
from nvpair.proxy.routing.nodes import Node

__all__ = ["FLOOR", "PREFILL_FACTOR", "STEP", "EngineQueues", "firstTokenBudget"]

FLOOR = 0.25
"""Seconds every first token is given, whatever its prompt (a decode step, the network)."""
PREFILL_FACTOR = 3.0
"""How many times the prompt's estimated prefill a first token is given on top."""
STEP = 0.1
"""Seconds between two checks while any attempt is watched."""
MAX_WATCHED = 65536

_WARM = (ModelState.LOADED, ModelState.UNKNOWN)


def firstTokenBudget(bodyBytes: int, msPerToken: float | None) -> float:
    """Seconds a streamed request's first token may take before it is taken as waiting in
    its engine's queue: ``FLOOR`` plus ``PREFILL_FACTOR`` times the prompt's prefill
    (``bodyBytes`` over placement's characters per token: the body's JSON makes it an upper
    estimate) at ``msPerToken`` (placement's default when unknown)."""
    rate = DEFAULT_MS_PER_TOKEN if msPerToken is None else msPerToken
    return FLOOR + PREFILL_FACTOR * bodyBytes / CHARS_PER_TOKEN * rate / 1000


class _Entry:
    """One watched attempt."""

    __slots__ = ("attempt", "nodeId", "model", "owners", "sentAt", "due")

    def __init__(
        self,
        attempt: IMovable,
        nodeId: str,
        model: str,
        owners: Callable[[], tuple[Node, ...]],
        sentAt: float,
        due: float,
    ) -> None:
        self.attempt = attempt
        self.nodeId = nodeId
        self.model = model
        self.owners = owners
        self.sentAt = sentAt
        self.due = due


@implementer(IEngineQueues)
class EngineQueues:
    """The process's watched first attempts and the one timer that checks them."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        ledger: IRoomLedger,
        states: IEngineStates,
        residency: IResidency | None,
    ) -> None:
        self.clock = clock
        self.ledger = ledger
        self.states = states
        self.residency = residency
        self.moved = 0
        self._entries: dict[IMovable, _Entry] = {}
        self._timer: IDelayedCall | None = None

    def watch(
        self,
        attempt: IMovable,
        model: str,
        owners: Callable[[], tuple[Node, ...]],
        bodyBytes: int,
    ) -> None:
        entries, ledger, nodeId = self._entries, self.ledger, attempt.node.id
        if len(entries) >= MAX_WATCHED or not ledger.reportsSlots(nodeId):
            return
        free = ledger.free(nodeId)  # this attempt counted: below 0, sent to wait there
        if free is None or free < 0:
            return
        now = self.clock.seconds()
        budget = firstTokenBudget(bodyBytes, self.states.prefillMs(nodeId))
        entries[attempt] = _Entry(attempt, nodeId, model, owners, now, now + budget)
        if self._timer is None:
            self._timer = self.clock.callLater(STEP, self._tick)

    def discard(self, attempt: IMovable) -> None:
        entries = self._entries
        if entries.pop(attempt, None) is not None and not entries and self._timer is not None:
            self._timer.cancel()  # none left: no timer stays behind
            self._timer = None

    def __len__(self) -> int:
        return len(self._entries)

    def _tick(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        for entry in [e for e in self._entries.values() if e.due <= now]:
            if self._entries.get(entry.attempt) is entry and self._freeElsewhere(entry):
                self._move(entry, now)
        if self._entries and self._timer is None:  # a move may have started one (watch)
            self._timer = self.clock.callLater(STEP, self._tick)

    def _freeElsewhere(self, entry: _Entry) -> bool:
        """Whether the attempt's node reports its slots, holds the model, and another
        owner holding it has a free slot now."""
        ledger, residency, model = self.ledger, self.residency, entry.model
        if not ledger.reportsSlots(entry.nodeId):
            return False
        if residency is not None and residency.state(entry.nodeId, model) not in _WARM:
            return False  # waiting for a load, not behind another request
        for node in entry.owners():
            if node.id == entry.nodeId or (ledger.free(node.id) or 0) <= 0:
                continue
            if residency is None or residency.state(node.id, model) in _WARM:
                return True
        return False

    def _move(self, entry: _Entry, now: float) -> None:
        del self._entries[entry.attempt]
        self.ledger.slotTaken(entry.nodeId)
        if entry.attempt.move():
            self.moved += 1
            self.log.info("request-moved", node=entry.nodeId, waited=round(now - entry.sentAt, 3))
