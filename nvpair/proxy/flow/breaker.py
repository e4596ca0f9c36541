"""A breaker per node (spec §11 "The breaker"): pure policy on a clock.

Least-busy ordering loves a node that fails fast: it always has the fewest requests in
flight.  Each node's *fast failures* (a retryable status that is not a busy answer, a
transport error) are counted over the last ``WINDOW`` seconds; at ``THRESHOLD`` the node
*opens*: it goes last in the order (still tried when nothing else can serve) for a cool-down
(``BASE_COOLDOWN`` at first, never shorter than the engine's ``Retry-After``).  Then the node
is *half-open*: one request at a time probes it (it goes first for that request; a probe
with no verdict within ``PROBE_LEASE`` passes to the next request).  A success closes it; a
failure opens it again for twice the cool-down, up to ``MAX_COOLDOWN``.

State is kept only for nodes that failed recently or are not closed, at most
``nodestate.table.MAX_NODES`` (the least recently touched forgotten first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from nvpair.proxy.nodestate.table import BoundedTable

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node

__all__ = [
    "BASE_COOLDOWN",
    "MAX_COOLDOWN",
    "PROBE_LEASE",
    "THRESHOLD",
    "WINDOW",
    "Breakers",
    "BreakerState",
    "retryAfterSeconds",
]

WINDOW = 10.0
THRESHOLD = 5
BASE_COOLDOWN = 1.0
MAX_COOLDOWN = 30.0
PROBE_LEASE = 5.0


def retryAfterSeconds(values: Sequence[bytes] | None) -> float | None:
    """An engine's ``Retry-After`` in seconds (delay-seconds only, at most
    ``MAX_COOLDOWN``), or None when absent or not a number."""
    if not values:
        return None
    text = values[0].strip()
    if not text.isdigit() or len(text) > 9:
        return None
    return float(min(int(text), MAX_COOLDOWN))


class BreakerState(Enum):
    """Where one node's breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


CLOSED = BreakerState.CLOSED
OPEN = BreakerState.OPEN
HALF_OPEN = BreakerState.HALF_OPEN


class _Breaker:
    __slots__ = ("state", "failures", "cooldown", "until", "probeAt", "opens")

    def __init__(self) -> None:
        self.state = CLOSED
        self.failures: deque[float] = deque(maxlen=THRESHOLD)
        self.cooldown = BASE_COOLDOWN
        self.until = 0.0  # open: when it turns half-open
        self.probeAt: float | None = None  # half-open: when the probe was handed out
        self.opens = 0


class Breakers:
    """The breakers of every node of the process (one per node id, shared by facades)."""

    def __init__(self, onOpen: Callable[[str], None] | None = None) -> None:
        self._nodes: BoundedTable[str, _Breaker] = BoundedTable(_Breaker)
        self._onOpen = onOpen
        self.opened = 0  # opens counted since the start

    def __len__(self) -> int:
        return len(self._nodes)

    def state(self, nodeId: str, now: float) -> BreakerState:
        """``nodeId``'s state now (an open breaker past its cool-down reads half-open)."""
        breaker = self._nodes.get(nodeId)
        if breaker is None:
            return CLOSED
        if breaker.state is OPEN and now >= breaker.until:
            return HALF_OPEN
        return breaker.state

    def failed(self, nodeId: str, now: float, retryAfter: float | None = None) -> None:
        """A fast failure on ``nodeId`` (``retryAfter``: the engine's, seconds)."""
        breaker = self._nodes.touch(nodeId)
        minimum = retryAfter or 0.0
        if breaker.state is CLOSED:
            failures = breaker.failures
            failures.append(now)
            while failures and now - failures[0] > WINDOW:
                failures.popleft()
            if len(failures) >= THRESHOLD:
                self._open(nodeId, breaker, now, max(breaker.cooldown, minimum))
            return
        if breaker.state is HALF_OPEN or now >= breaker.until:
            # The probe (or a request sent there as the last resort once the cool-down
            # ran out) failed: open again, for twice as long.
            breaker.cooldown = min(breaker.cooldown * 2, MAX_COOLDOWN)
            self._open(nodeId, breaker, now, max(breaker.cooldown, minimum))
            return
        breaker.until = max(breaker.until, now + minimum)  # tried as the last resort

    def _open(self, nodeId: str, breaker: _Breaker, now: float, cooldown: float) -> None:
        breaker.state = OPEN
        breaker.until = now + cooldown
        breaker.probeAt = None
        breaker.failures.clear()
        breaker.opens += 1
        self.opened += 1
        if self._onOpen is not None:
            self._onOpen(nodeId)

    def succeeded(self, nodeId: str) -> None:
        """``nodeId`` answered (committed a response that is not a failure): close it."""
        breaker = self._nodes.get(nodeId)
        if breaker is None:
            return
        if breaker.state is CLOSED and not breaker.failures:
            return
        breaker.state = CLOSED
        breaker.cooldown = BASE_COOLDOWN
        breaker.probeAt = None
        breaker.failures.clear()

    def order(self, nodes: Sequence[Node], now: float) -> tuple[Sequence[Node], tuple[Node, ...]]:
        """Split ``nodes`` into those to order as usual and the demoted (open ones, in their
        order), tried after them.  A half-open node whose probe is free is handed out: this
        request orders it alone and tries everything else after it.
        Returns ``nodes`` itself when nothing is demoted (the common case costs a lookup
        per node)."""
        table = self._nodes
        if not table:
            return nodes, ()
        probe: Node | None = None
        demoted: list[Node] = []
        for node in nodes:
            breaker = table.get(node.id)
            if breaker is None or breaker.state is CLOSED:
                continue
            if breaker.state is OPEN and now < breaker.until:
                demoted.append(node)
                continue
            breaker.state = HALF_OPEN
            if probe is None and (breaker.probeAt is None or now - breaker.probeAt >= PROBE_LEASE):
                breaker.probeAt = now
                probe = node
            else:
                demoted.append(node)
        if probe is None and not demoted:
            return nodes, ()
        if len(demoted) == len(nodes):
            return nodes, ()  # nothing else can serve: the usual order over all of them
        if probe is not None:
            # The probing request tries the half-open node first, then the rest as listed.
            others = [node for node in nodes if node is not probe and node not in demoted]
            return (probe,), (*others, *demoted)
        return tuple(node for node in nodes if node not in demoted), tuple(demoted)

    def snapshot(self, now: float) -> dict[str, dict[str, object]]:
        """Per node with state: ``state``, ``opens``, ``cooldownSeconds``, ``recentFailures``
        and, when open, ``retryInSeconds``."""
        out: dict[str, dict[str, object]] = {}
        for nodeId, breaker in self._nodes.items():
            state = self.state(nodeId, now)
            entry: dict[str, object] = {
                "state": state.value,
                "opens": breaker.opens,
                "cooldownSeconds": breaker.cooldown,
                "recentFailures": sum(1 for t in breaker.failures if now - t <= WINDOW),
            }
            if state is OPEN:
                entry["retryInSeconds"] = round(max(0.0, breaker.until - now), 3)
            out[nodeId] = entry
        return out
