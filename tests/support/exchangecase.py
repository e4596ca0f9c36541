"""The shared setup of the exchange tests (``test_exchange_*``): one request's way through the
fleet on a Clock (spec §5, §5.1, §5.3-§5.5, §6).

Every upstream attempt is a scripted ``Call`` of ``FakeUpstream``; the client is a
``FakeRequest``; the context records workload events, node activity and reservations.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import CHAT, makeFacade, node, startExchange

SSE = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)


class LoopCase(SynchronousTestCase):
    """Shared setup: a context on a Clock and a facade with owners A and B of ``m1``."""

    nodes: tuple[str, ...] = ("A", "B")
    settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.context = FakeContext(**self.settings)
        self.clock = self.context.clock
        self.upstream = self.context.upstream
        self.facade = makeFacade(self.clock, [node(n) for n in self.nodes])

    def start(
        self,
        request: FakeRequest | None = None,
        inference: bool = True,
        model: str | None = "m1",
        body: bytes = CHAT,
    ) -> tuple[Exchange, FakeRequest]:
        return startExchange(self.context, self.facade, request, inference, model, body)

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return self.context.sink.workloadEvents()

    def shape(self) -> list[tuple[str, str, str | None]]:
        """(method, state, scheduledOn) per workload event."""
        return [(m, i["state"], i.get("scheduledOn")) for m, i in self.events()]

    def terminal(self) -> dict[str, Any]:
        ends = [i for m, i in self.events() if m in ("workload:completed", "workload:errored")]
        self.assertEqual(len(ends), 1, "exactly one terminal event")
        return ends[0]

    def assertReleased(self) -> None:
        """Nothing of the request is left behind: reservations, in-flight counts, exchanges."""
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.assertEqual(self.context.activity.inFlight, {})
        self.assertEqual(self.context.exchanges, set())
        self.assertEqual(len(self.context.record.ended), 1)

    def errorReason(self, request: FakeRequest) -> str:
        return str(json.loads(request.body)["error"]["code"])
