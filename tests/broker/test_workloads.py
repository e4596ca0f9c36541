"""Workload lifecycle events (spec §5.5, protocol §5) and node activity."""

from __future__ import annotations

import json
import re
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.jsonrpc import Prepared
from nvpair.proxy.broker.workloads import KEPT_CHARS, WorkloadReporter, keptCopy
from nvpair.proxy.testing.fakecontext import ListSink


class WorkloadTests(SynchronousTestCase):
    """A reporter on a ``Clock`` sending to a list."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000.5)
        self.sink = ListSink()
        self.reporter = WorkloadReporter(self.sink, self.clock)

    def infos(self) -> list[tuple[str, dict[str, Any]]]:
        return [(m, p["workloadInfo"]) for m, p in self.sink.sent]

    def test_admissionEvent(self) -> None:
        """Admission emits ``submitted`` queued, unplaced, with every required field."""
        w = self.reporter.admit("ollama", "llama3:latest")
        [(method, info)] = self.infos()
        self.assertEqual(method, "workload:submitted")
        self.assertEqual(
            info,
            {
                "id": w.id,
                "model": "llama3:latest",
                "engine": "ollama",
                "runId": self.reporter.runId,
                "state": "queued",
                "originatedFrom": "",
                "createdAt": 1000500,
                "error": None,
                "requesterId": None,
                "seq": 1,
            },
        )
        self.assertRegex(self.reporter.runId, re.compile(r"^[0-9a-f]{16}$"))

    def test_lifecycle(self) -> None:
        """Dispatch, unplace, start and complete carry the right state and placement."""
        w = self.reporter.admit("llamacpp", "m1")
        w.submitted("A")
        w.submitted(None)
        w.submitted("B")
        self.clock.advance(2)
        w.started("B")
        self.clock.advance(3)
        self.assertTrue(w.finish("completed", stats={"completionTokens": 3}))
        events = self.infos()
        self.assertEqual(
            [m for m, _ in events],
            ["workload:submitted"] * 4 + ["workload:started", "workload:completed"],
        )
        self.assertEqual(
            [i.get("scheduledOn") for _, i in events], [None, "A", None, "B", "B", "B"]
        )
        self.assertEqual([i["state"] for _, i in events], ["queued"] * 4 + ["running", "completed"])
        self.assertEqual([i["seq"] for _, i in events], [1, 2, 3, 4, 5, 6])
        started, done = events[4][1], events[5][1]
        self.assertEqual(started["startedAt"], 1002500)
        self.assertNotIn("completedAt", started)
        self.assertNotIn("stats", started)
        self.assertEqual(done["completedAt"], 1005500)
        self.assertEqual(done["stats"], {"completionTokens": 3})
        self.assertEqual(w.attempts, 2)

    def test_exactlyOneTerminal(self) -> None:
        """A second finish (any state) emits nothing and returns False."""
        w = self.reporter.admit("ollama", "m:latest")
        self.assertTrue(w.finish("failed", "no_owner"))
        self.assertFalse(w.finish("completed"))
        self.assertFalse(w.finish("cancelled"))
        w.submitted("A")
        w.started("A")
        methods = [m for m, _ in self.infos()]
        self.assertEqual(methods, ["workload:submitted", "workload:errored"])
        self.assertEqual(self.infos()[1][1]["error"], "no_owner")
        self.assertEqual(self.infos()[1][1]["state"], "failed")
        self.assertEqual(self.reporter.live, 0)
        self.assertEqual(self.reporter.terminals, {"failed": 1})

    def test_cancelled(self) -> None:
        """A cancelled workload ends with ``workload:errored`` state cancelled."""
        w = self.reporter.admit("ollama", "m:latest")
        w.finish("cancelled", "client went away")
        method, info = self.infos()[-1]
        self.assertEqual((method, info["state"]), ("workload:errored", "cancelled"))

    def test_noSubmittedAfterStart(self) -> None:
        """Once running, ``submitted`` no longer emits."""
        w = self.reporter.admit("ollama", "m:latest")
        w.started("A")
        w.submitted("B")
        self.assertEqual([m for m, _ in self.infos()], ["workload:submitted", "workload:started"])

    def test_seqAcrossWorkloads(self) -> None:
        """``seq`` counts every event of the process; ids count workloads."""
        a = self.reporter.admit("ollama", "a:latest")
        b = self.reporter.admit("lmstudio", "b")
        a.submitted("N")
        b.finish("failed", "no_owner")
        a.finish("completed")
        self.assertEqual([i["seq"] for _, i in self.infos()], [1, 2, 3, 4, 5])
        self.assertEqual([i["id"] for _, i in self.infos()], ["1", "2", "1", "2", "1"])
        self.assertEqual({i["runId"] for _, i in self.infos()}, {self.reporter.runId})

    def test_runIdFixed(self) -> None:
        """A given run id is used; different reporters get different random ones."""
        self.assertEqual(
            WorkloadReporter(self.sink, self.clock, "00ff00ff00ff00ff").runId, "00ff00ff00ff00ff"
        )
        self.assertNotEqual(
            WorkloadReporter(self.sink, self.clock).runId,
            WorkloadReporter(self.sink, self.clock).runId,
        )


class ActivityTests(SynchronousTestCase):
    """``discovery:node-activity`` on every change of a node's in-flight count."""

    def test_counts(self) -> None:
        """Each change is announced with the new count, never below zero."""
        sink = ListSink()
        activity = Activity(sink)
        activity.change("A", 1)
        activity.change("A", 1)
        activity.change("B", 1)
        activity.change("A", -2)
        activity.change("A", -1)
        self.assertEqual(
            sink.sent,
            [
                ("discovery:node-activity", {"nodeId": "A", "inFlight": 1}),
                ("discovery:node-activity", {"nodeId": "A", "inFlight": 2}),
                ("discovery:node-activity", {"nodeId": "B", "inFlight": 1}),
                ("discovery:node-activity", {"nodeId": "A", "inFlight": 0}),
                ("discovery:node-activity", {"nodeId": "A", "inFlight": 0}),
            ],
        )
        self.assertEqual(activity.total(), 1)


class DeafSink(ListSink):
    """A sink that says nobody listens (standalone mode's), yet records what reaches it."""

    listening = False


class KeptCopyTests(SynchronousTestCase):
    """What outlives a workload is bounded whatever the client named (spec §13, issue 32)."""

    def test_keptCopy(self) -> None:
        """Up to ``KEPT_CHARS`` characters a string is kept as is; a longer one is cut
        there with a marker saying how much was cut."""
        self.assertEqual(keptCopy("m" * KEPT_CHARS), "m" * KEPT_CHARS)
        self.assertEqual(keptCopy("abcdef", 4), "abcd…[+2 chars]")
        cut = keptCopy("x" * (8 << 20))
        assert cut is not None
        self.assertEqual(cut, "x" * KEPT_CHARS + f"…[+{(8 << 20) - KEPT_CHARS} chars]")

    def test_recentBounded(self) -> None:
        """The recent workloads keep a cut copy of a huge model name, and the finished
        workload keeps nothing longer; its events carried the name whole."""
        sink = ListSink()
        reporter = WorkloadReporter(sink, Clock(), recent=3)
        huge = "m" * (1 << 20)
        for _ in range(5):
            w = reporter.admit("ollama", huge)
            w.finish("failed", "no_owner")
            self.assertEqual(w.model, keptCopy(huge))
        self.assertEqual(len(reporter.recent), 3)
        for entry in reporter.recent:
            self.assertEqual(entry["model"], keptCopy(huge))
            self.assertLess(len(str(entry)), 1024)
        self.assertTrue(all(p["workloadInfo"]["model"] == huge for _, p in sink.sent))
        # Each event holds its own text: written after the workload let go, still whole.
        for _, params in sink.sent:
            assert isinstance(params, Prepared)
            written = json.loads(params.paramsJSON())["workloadInfo"]["model"]
            self.assertTrue(written == huge, "the event's model is not the admitted one")

    def test_otherFieldsBounded(self) -> None:
        """A recent workload's node and error are bounded copies too."""
        reporter = WorkloadReporter(ListSink(), Clock())
        w = reporter.admit("ollama", "m1")
        w.submitted("n" * 300)
        w.finish("failed", "e" * 300)
        entry = reporter.recent[-1]
        self.assertEqual(
            (entry["node"], entry["error"]), (keptCopy("n" * 300), keptCopy("e" * 300))
        )


class NobodyListeningTests(SynchronousTestCase):
    """With nobody receiving notifications nothing is built or sent; the counts still hold."""

    def test_workloadsCountedNotSent(self) -> None:
        """No event reaches a deaf sink; ``seq``, terminals and the recent list still move."""
        sink = DeafSink()
        reporter = WorkloadReporter(sink, Clock())
        w = reporter.admit("ollama", "m:latest")
        w.submitted("A")
        w.started("A")
        w.finish("completed")
        self.assertEqual(sink.sent, [])
        self.assertEqual(reporter.seq, 4)
        self.assertEqual(reporter.terminals, {"completed": 1})
        self.assertEqual([r["state"] for r in reporter.recent], ["completed"])
        self.assertEqual(reporter.live, 0)

    def test_activityCountedNotSent(self) -> None:
        """In-flight counts are kept for a deaf sink, without a notification."""
        sink = DeafSink()
        activity = Activity(sink)
        activity.change("A", +1)
        activity.change("A", +1)
        activity.change("A", -1)
        self.assertEqual(sink.sent, [])
        self.assertEqual(activity.inFlight, {"A": 1})
