"""Admission by predicted wait (spec §11 "The queue"): once the drain rate is known, the
queue holds no more than it lets out within ``--queue-timeout``; the rest are refused at
once with a ``Retry-After`` from that rate, instead of waiting to time out."""

from __future__ import annotations

import json
from typing import Any

from nvpair.proxy.features import useStandalone
from nvpair.proxy.flow.predicted import OBSERVED_SAMPLES
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest


def client(key: bytes) -> FakeRequest:
    """A request from the client holding ``key``."""
    return FakeRequest(headers={b"content-type": [b"application/json"], b"authorization": [key]})


class PredictedWaitCase(LoopCase):
    """One owner with one slot; requests that hold it one second each; the queue's timeout
    ten seconds, its bound 64."""

    nodes = ("A",)
    settings: dict[str, Any] = {"queueMax": 64, "queueTimeout": 10.0}

    def setUp(self) -> None:
        super().setUp()
        features = useStandalone(self.context, affinity=False)
        self.ledger, self.queueing = features.ledger, features.queueing
        self.ledger.configure("A", 1)

    def serveOne(self) -> None:
        """The request on A commits and ends after one second."""
        call = self.upstream.pending()[0]
        response = call.respond(200)
        response.send(b"{}")
        self.clock.advance(1.0)
        response.end()

    def refusals(self, requests: list[FakeRequest]) -> list[FakeRequest]:
        return [r for r in requests if r.code == 503]

    def reasonOf(self, request: FakeRequest) -> str:
        return str(json.loads(request.body)["error"]["code"])


class PredictedWaitTests(PredictedWaitCase):
    """Requests that could not start before ``--queue-timeout`` are refused at once."""

    def test_unknownRateKeepsTheBound(self) -> None:
        """Before any request ended the rate is unknown: up to ``--queue-max`` wait."""
        requests = [self.start()[1] for _ in range(70)]
        self.assertEqual(len(self.refusals(requests)), 70 - 1 - 64)

    def test_burstShedOnceTheRateIsKnown(self) -> None:
        """A burst queued while the rate was unknown: one request's end is a guess, the
        second's tells the service time (one second, one slot: one a second), and every
        waiting request that could not start before its ten seconds run out is refused at
        once, with a Retry-After from that rate; every one kept is served in time."""
        requests = [self.start(client(b"k%d" % i))[1] for i in range(40)]
        self.serveOne()
        self.assertEqual(self.refusals(requests), [])
        self.serveOne()  # at 2 s: the third request goes, the rest wait since 0 s
        refused = self.refusals(requests)
        self.assertEqual(len(refused), 40 - 3 - 7)  # the k-th starts at 2 + k s: k < 8
        for request in refused:
            self.assertEqual(self.reasonOf(request), "queue_full")
            self.assertEqual(request.header(b"retry-after"), [b"7"])  # what stays drains by then
        for _ in range(8):
            self.serveOne()
        self.assertEqual([r.code for r in requests if r.code is None], [])
        self.assertEqual(len([r for r in requests if r.code == 200]), 10)

    def test_newArrivalBeyondTheBound(self) -> None:
        """With the rate known, a tenth waiting request would start too late: refused at
        once; one from a client with nothing waiting takes the busiest client's newest's
        place."""
        for _ in range(2):
            self.start()
            self.serveOne()
        for _ in range(10):  # one goes at once, nine wait: the k-th starts k s after it
            self.start(client(b"greedy"))
        _, late = self.start(client(b"greedy"))
        self.assertEqual((late.code, late.header(b"retry-after")), (503, [b"9"]))
        _, honest = self.start(client(b"honest"))
        self.assertIsNone(honest.code)

    def test_observedRateTakesOver(self) -> None:
        """After enough dispatches out of the queue, the rate observed is what counts."""
        self.start()
        for _ in range(OBSERVED_SAMPLES + 2):
            self.start(client(b"k"))
        for _ in range(OBSERVED_SAMPLES + 1):
            self.serveOne()
        line = next(iter(self.queueing.lines.values()))
        rate = self.queueing.shedding.drainRate(line.queue, lambda: self.queueing.usable(line))
        assert rate is not None
        self.assertLess(abs(rate - 1.0), 0.15)
