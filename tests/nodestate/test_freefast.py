"""``RoomLedger.free`` reads the clock only for a record with reported slots or a learnt
limit: the same free slots as reading every source, whatever happened before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.ledger import RoomLedger

NODES = ("n", "m")


class _EverySource(RoomLedger):
    """``free`` reading every source of every record."""

    def free(self, nodeId: str) -> int | None:
        room = self.rooms.get(nodeId)
        ours = self.ours.get(nodeId, 0)
        reported = None
        limits: list[int | None] = []
        if room is not None:
            now = self.clock.seconds()
            reported = self._reported(room, now)
            limits += [room.configured, self._learnt(room, ours, now), reported]
        if reported is None:
            limits.append(self.parallel(nodeId))
        known = [limit for limit in limits if limit is not None]
        return min(known) - ours if known else None


_node = st.sampled_from(NODES)
_counts = st.none() | st.integers(0, 4)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("activity"), _node, st.sampled_from((1, -1))),
        st.tuples(st.just("probeSent"), _node),
        st.tuples(st.just("probed"), _node, _counts, _counts),
        st.tuples(st.just("probeFailed"), _node),
        st.tuples(st.just("configure"), _node, _counts),
        st.tuples(st.just("busyAnswer"), _node, st.sampled_from((429, 503, 500))),
        st.tuples(st.just("served"), _node),
        st.tuples(st.just("parallel"), _counts),
        st.tuples(st.just("advance"), st.floats(0.0, 8.0)),
    ),
    max_size=30,
)


def _count(value: object) -> int | None:
    return None if value is None else int(str(value))


class FreeTests(SynchronousTestCase):
    """The early way never differs from reading every source."""

    @settings(max_examples=300, deadline=None)
    @given(_steps)
    def test_sameFree(self, steps: list[tuple[object, ...]]) -> None:
        """After each step of a random history (ours starting and ending, probes, limits,
        busy answers, a learnt parallel level, time passing), both say the same free slots
        of every node."""
        clock = Clock()
        clock.advance(1_800_000_000.0)
        ours: dict[str, int] = {}
        parallel: list[int | None] = [None]
        ledgers = [RoomLedger(clock, ours), _EverySource(clock, ours)]
        for ledger in ledgers:
            ledger.parallel = lambda nodeId: parallel[0]
        for step in steps:
            what, args = step[0], step[1:]
            if what == "advance":
                clock.advance(float(str(args[0])))
            elif what == "parallel":
                parallel[0] = _count(args[0])
            elif what == "activity":
                nodeId, delta = str(args[0]), int(str(args[1]))
                ours[nodeId] = max(0, ours.get(nodeId, 0) + delta)
                for ledger in ledgers:
                    ledger.activityChanged(nodeId, delta)
            else:
                for ledger in ledgers:
                    self._apply(ledger, str(what), args)
            for nodeId in NODES:
                fast, every = (ledger.free(nodeId) for ledger in ledgers)
                self.assertEqual(fast, every, (step, nodeId))

    def _apply(self, ledger: RoomLedger, what: str, args: tuple[object, ...]) -> None:
        nodeId = str(args[0])
        if what == "probed":
            ledger.probed(nodeId, _count(args[1]), _count(args[2]), 1.0)
        elif what == "configure":
            ledger.configure(nodeId, _count(args[1]))
        elif what == "busyAnswer":
            ledger.busyAnswer(nodeId, int(str(args[1])), None)
        else:
            getattr(ledger, what)(nodeId)
