"""Two models' queues in front of one node (spec §11, "The queue"): the slot that frees goes
to the request waiting longest, whichever model it asks for, not to the queue made first."""

from __future__ import annotations

import json
from typing import Any

from nvpair.proxy.features import useStandalone
from nvpair.proxy.testing.upstreamspy import FakeResponse
from tests.support.exchangecase import LoopCase
from tests.support.fakeupstream import CHAT, makeFacade, node


class SharedNodeTests(LoopCase):
    """One node A serving m1 and m2, one request of ours at a time."""

    settings: dict[str, Any] = {"queueMax": 64, "queueTimeout": 30.0}

    def setUp(self) -> None:
        super().setUp()
        self.facade = makeFacade(self.clock, [node("A", ("m1", "m2"))])
        self.features = useStandalone(self.context, affinity=False)
        self.features.ledger.configure("A", 1)

    def ask(self, model: str) -> None:
        self.start(model=model, body=CHAT.replace(b'"m1"', f'"{model}"'.encode()))

    def commit(self, index: int) -> FakeResponse:
        response: FakeResponse = self.upstream.calls[index].respond(200)
        response.send(b"{}")
        return response

    def models(self) -> list[str]:
        return [json.loads(call.body)["model"] for call in self.upstream.calls]

    def test_longestWaitFirst(self) -> None:
        """An m2 request waits from t=0, an m1 one from t=1, then m2 gets a newer one (the
        queue used last): when the slot frees the oldest goes (m2's first), then m1's, then
        m2's second."""
        self.ask("m1")
        first = self.commit(0)
        self.ask("m2")
        self.clock.advance(1.0)
        self.ask("m1")
        self.clock.advance(1.0)
        self.ask("m2")
        self.assertEqual(self.models(), ["m1"])
        first.end()
        self.assertEqual(self.models(), ["m1", "m2"])
        self.commit(1).end()
        self.assertEqual(self.models(), ["m1", "m2", "m1"])
        self.commit(2).end()
        self.assertEqual(self.models(), ["m1", "m2", "m1", "m2"])
