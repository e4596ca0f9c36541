"""The queue's unit case: the placement loop on a Clock with owners A and B of one slot
each and standalone's queue on, and requests told apart by their key."""

from __future__ import annotations

import json
from typing import Any

from nvpair.proxy.features import useStandalone
from nvpair.proxy.testing.upstreamspy import FakeResponse
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest


def client(key: bytes) -> FakeRequest:
    """A request from the client holding ``key``."""
    return FakeRequest(headers={b"content-type": [b"application/json"], b"authorization": [key]})


class QueueCase(LoopCase):
    """Owners A and B with one slot each (engine state), the queue on."""

    settings: dict[str, Any] = {"queueMax": 4, "queueTimeout": 30.0}

    def setUp(self) -> None:
        super().setUp()
        features = useStandalone(self.context, affinity=False)
        self.ledger = features.ledger
        for n in self.nodes:
            self.ledger.configure(n, 1)
        self.queueing = features.queueing

    def commit(self, index: int) -> FakeResponse:
        """Answer upstream call ``index`` with a 200 that starts streaming."""
        response: FakeResponse = self.upstream.calls[index].respond(200)
        response.send(b"{}")
        return response

    def depth(self) -> int:
        return sum(d for _, _, d, _, _ in self.queueing.depths())

    def reason(self, request: FakeRequest) -> str:
        return str(json.loads(request.body)["error"]["code"])
