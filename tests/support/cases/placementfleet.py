"""A placement fleet for the tests of ``choose`` and ``Affinity``: four owners with a room
ledger and engine states fed by hand on a ``Clock``, and tenants' requests."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.choose import (
    CHARS_PER_TOKEN,
    DEFAULT_MS_PER_TOKEN,
    RECOMPUTE_SECONDS,
    Choice,
    Hold,
    Placed,
)
from nvpair.proxy.placement.keys import AffinityKey, keyFor
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

CHAT = b"/v1/chat/completions"
NODES = tuple(Node(n, False, (n,), frozenset({"m"})) for n in ("A", "B", "C", "D"))


def tenantPrompt(tenant: int) -> str:
    """A long system prompt of its own per tenant (about 2.6k characters)."""
    return f"You are the assistant of tenant {tenant}. Follow these rules carefully! " * 40


def request(system: str, user: str, model: str = "m", *earlier: str) -> AffinityKey:
    """A chat request: ``system``, then the conversation's ``earlier`` questions (each with
    an answer), then ``user``."""
    messages = [{"role": "system", "content": system}]
    for question in earlier:
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"answer to {question}"},
        ]
    messages.append({"role": "user", "content": user})
    key = keyFor("llamacpp", model, CHAT, {"model": model, "messages": messages})
    assert key is not None
    return key


def followUp(system: str, first: str, then: str) -> AffinityKey:
    """The next turn of the conversation ``request(system, first)`` began."""
    return request(system, then, "m", first)


RECOMPUTE_CHARS = int(RECOMPUTE_SECONDS * 1000 / DEFAULT_MS_PER_TOKEN * CHARS_PER_TOKEN)


class Fleet:
    """An ``Affinity`` over four owners with a room ledger and engine states fed by hand
    on a ``Clock``."""

    def __init__(self, states: bool = True) -> None:
        self.clock = Clock()
        self.reservations = ReservationMap()
        self.ours: dict[str, int] = {}
        self.ledger = RoomLedger(self.clock, self.ours) if states else None
        self.states = EngineStates(self.clock, self.ledger) if self.ledger else None
        self.affinity = Affinity(self.clock, self.reservations, self.ledger, self.states)
        self.choice: Choice | None = None

    def report(self, nodeId: str, busy: int, total: int = 2, **kw: object) -> None:
        assert self.states is not None and self.ledger is not None
        self.states.record(nodeId, EngineReport(busy=busy, total=total, **kw), 1.0, "/slots")  # type: ignore[arg-type]
        self.ledger.probed(nodeId, busy, total, 1.0)

    def place(
        self,
        key: AffinityKey,
        serve: bool = True,
        model: str = "m",
        hold: Hold = Hold.NONE,
        crowded: bool = False,
    ) -> tuple[str, Placed | None]:
        """Where ``key`` goes and how (None: held for that node, ``self.choice.hold``)."""
        choice = self.choice = self.affinity.place(list(NODES), key, model, hold, "e", crowded)
        assert choice is not None
        if choice.hold is not None:
            return choice.node.id, None
        if serve:
            self.affinity.served(key, choice.node.id)
        return choice.node.id, choice.result
