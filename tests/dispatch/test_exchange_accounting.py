"""What an exchange reports (spec §5.5, §6): reservations, in-flight counts and the exact
workload event sequences."""

from __future__ import annotations

from nvpair.proxy.routing.reservations import NodeLoad
from tests.support.exchangecase import LoopCase
from tests.support.fakeupstream import (
    node,
    setNodes,
)


class ReservationTests(LoopCase):
    """Reservations: least-loaded listed candidate, moved per attempt, released always (§6)."""

    nodes = ("A", "B", "C")

    def prioritize(self, load: dict[str, int] | None = None) -> None:
        load = load or {}
        self.context.reservations.applyPriority(
            1, ["A", "B", "C"], {n: NodeLoad(load.get(n, 0), 0.0) for n in self.nodes}
        )

    def test_leastLoadedFirst(self) -> None:
        """The least-loaded listed candidate is reserved and tried first; ties keep order."""
        self.prioritize({"A": 2, "B": 1, "C": 1})
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B"])
        self.assertEqual(self.context.reservations.byNode(), {"B": 1})
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B", "C"])
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B", "C", "A"], "a tie keeps order")

    def test_concurrentSpread(self) -> None:
        """Equal load: concurrent requests spread A, B, C, A, ..."""
        self.prioritize()
        for _ in range(6):
            self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "C", "A", "B", "C"])
        self.assertEqual(self.context.reservations.byNode(), {"A": 2, "B": 2, "C": 2})
        for call in list(self.upstream.calls):
            call.answer(200, b"x")
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.start()
        self.assertEqual(self.upstream.nodesCalled()[-1], "A", "nothing leaked")

    def test_movesWithEachAttempt(self) -> None:
        """The reservation follows the node each attempt targets."""
        self.prioritize()
        ex, request = self.start()
        self.assertEqual(self.context.reservations.byNode(), {"A": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {"B": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {"C": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {}, "released before the backoff")
        self.clock.advance(0.25)
        self.assertEqual(self.context.reservations.byNode(), {"A": 1}, "re-taken next round")

    def test_releasedOnEveryEnding(self) -> None:
        """Normal end, client abort, mid-copy failure, internal error, shutdown: all release."""
        self.prioritize()
        endings = {
            "normal": lambda ex, req, resp: (resp.send(b"x"), resp.end()),
            "abort": lambda ex, req, resp: req.lose(),
            "midcopy": lambda ex, req, resp: (resp.send(b"x"), resp.fail()),
            "shutdown": lambda ex, req, resp: ex.shutdown(),
            "status": lambda ex, req, resp: (resp.send(b"e"), resp.end()),
        }
        for name, end in endings.items():
            ex, request = self.start()
            response = self.upstream.last().respond(400 if name == "status" else 200)
            self.assertEqual(self.context.reservations.totalReserved(), 1, name)
            end(ex, request, response)
            self.clock.advance(0)
            self.assertEqual(self.context.reservations.totalReserved(), 0, name)
            self.assertEqual(self.context.activity.inFlight, {}, name)

    def test_newGenerationSupersedes(self) -> None:
        """A newer snapshot supersedes live reservations; their later release is dropped."""
        self.prioritize()
        ex, request = self.start()
        self.context.reservations.applyPriority(2, ["A", "B", "C"], {"A": NodeLoad(1, 0.0)})
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        ex2, request2 = self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.upstream.calls[0].answer(200, b"x")
        self.assertEqual(self.context.reservations.byNode(), {"B": 1}, "never below zero")

    def test_redeliveredSnapshotKeepsReservations(self) -> None:
        """A redelivered generation changes nothing: live reservations still count."""
        self.prioritize()
        self.start()
        self.prioritize()
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])


class ActivityTests(LoopCase):
    """``discovery:node-activity`` on every change of the in-flight count."""

    def test_activityFollowsAttempts(self) -> None:
        """Dispatch to A (1), A fails (0), dispatch to B (1), B ends (0)."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().answer(200, b"x")
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 0), ("B", 1), ("B", 0)])

    def test_concurrentCounts(self) -> None:
        """Two requests on one node count 2."""
        self.facade.pin = "A"
        self.start()
        self.start()
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 2)])


class EventTests(LoopCase):
    """Exact event sequences (§5.5): ids, seq over every event, states, scheduledOn."""

    settings = {"maxDispatchAttempts": 3}

    def test_exhaustedBudgetSequence(self) -> None:
        """Three refusals on one owner: the final refusal answers 502; failed on A."""
        setNodes(self.facade, [node("A")])
        ex, request = self.start()
        for _ in range(3):
            self.upstream.last().refuse()
            self.clock.advance(5)
        self.assertEqual(request.code, 502)
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:errored", "failed", "A"),
            ],
        )
        seqs = [i["seq"] for _, i in self.events()]
        self.assertEqual(seqs, list(range(1, 8)))

    def test_seqIsProcessWide(self) -> None:
        """Two workloads share one seq counter and get distinct ids."""
        ex1, r1 = self.start()
        ex2, r2 = self.start()
        infos = [i for _, i in self.events()]
        self.assertEqual([i["seq"] for i in infos], [1, 2, 3, 4])
        self.assertEqual([i["id"] for i in infos], ["1", "1", "2", "2"])

    def test_timestampsInMilliseconds(self) -> None:
        """createdAt/startedAt/completedAt are integer milliseconds."""
        self.clock.advance(1.5)
        ex, request = self.start()
        self.clock.advance(0.25)
        response = self.upstream.last().respond(200)
        response.send(b"x")
        self.clock.advance(1)
        response.end()
        info = self.terminal()
        self.assertEqual(
            (info["createdAt"], info["startedAt"], info["completedAt"]), (1500, 1750, 2750)
        )
        self.assertEqual(info["stats"]["ttftMs"], 250)
