"""An ended exchange lets go of what the client sent (issue 32): the body and the model name
go at its terminal step (the parsed document was never kept), not whenever the cyclic collector
reaches the exchange (it sits in reference cycles with its placement loop and request)."""

from __future__ import annotations

import json

from nvpair.proxy.broker.workloads import Workload
from nvpair.proxy.dispatch.exchange import Exchange
from tests.support.exchangecase import SSE, USAGE, LoopCase
from tests.support.fakeupstream import startExchange

HUGE = "x" * (1 << 20)


class ReleaseTests(LoopCase):
    """What an exchange still holds once it has ended, by how it ended."""

    def assertLetGo(self, ex: Exchange) -> None:
        self.assertEqual(self.context.exchanges, set())
        self.assertEqual((ex.body, ex.model), (b"", None))
        workload = ex.workload
        assert isinstance(workload, Workload) and workload.ended
        self.assertLessEqual(len(workload.model), 300)

    def test_noOwner(self) -> None:
        """A model nobody serves (502 ``no_owner``): nothing of the request is kept."""
        document: dict[str, object] = {"model": HUGE, "messages": []}
        body = json.dumps(document).encode()
        ex, request = startExchange(self.context, self.facade, None, True, HUGE, body)
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "no_owner")
        self.assertLetGo(ex)

    def test_served(self) -> None:
        """A streamed answer that completed: nothing of the request is kept."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        response.send(USAGE)
        response.end()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertLetGo(ex)

    def test_clientGone(self) -> None:
        """A client that left mid-stream: nothing of the request is kept."""
        ex, request = self.start()
        self.upstream.last().respond(200).send(SSE)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertLetGo(ex)
