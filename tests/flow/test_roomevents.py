"""Room events and the fair queue (spec §11 "The queue"): an event drains the queue when
a request waits, is held, or a busy timer is pending; with none of these it does nothing."""

from __future__ import annotations

from nvpair.proxy.features import useStandalone
from tests.support.exchangecase import LoopCase


class RoomEventTests(LoopCase):
    """What one of ours ending does to the queue's timers and waiting requests."""

    nodes = ("A",)

    def setUp(self) -> None:
        super().setUp()
        self.queueing = useStandalone(self.context, affinity=False).queueing

    def busyThenQueued(self) -> None:
        """One of ours runs on A, a second is refused busy there and waits in the queue,
        with a timer for when A's learnt limit grows."""
        self.start()
        self.running = self.upstream.calls[0].respond(200)
        self.running.send(b"{}")
        self.waiting = self.start()[1]
        self.upstream.calls[1].respond(503)
        self.assertEqual(self.queueing.depths()[0][2], 1)

    def test_pendingBusyTimerCancelled(self) -> None:
        """The waiting request's client goes (nothing waits, its busy timer stays): the next
        room event still drains, and the timer goes with the queue it woke."""
        self.busyThenQueued()
        pending = len(self.clock.getDelayedCalls())
        self.waiting.lose()
        self.assertEqual(len(self.clock.getDelayedCalls()), pending - 1, "its queue timeout")
        self.running.end()
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(len(self.clock.getDelayedCalls()), pending - 2, "the busy timer")

    def test_waitingLetOut(self) -> None:
        """With a request waiting, one of ours ending lets it out to the node."""
        self.busyThenQueued()
        self.running.end()
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(self.queueing.depths()[0][2], 0)

    def test_nothingWaitingNothingPending(self) -> None:
        """With nothing waiting, held or pending, requests come and go and no timer of the
        queue is left behind."""
        for _ in range(3):
            self.start()
            self.upstream.calls[-1].respond(200).end()
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(self.queueing.depths()[0][2], 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
