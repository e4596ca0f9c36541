"""``Residency.state``'s early answer for a node that lists nothing and has no load of ours
pending: the same state as the full rules give, whatever happened before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.interfaces import ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates

NODES = ("n", "m")
MODELS = ("a", "b", "c")


class _FullRules(Residency):
    """``state`` without the early answer: every rule, in order."""

    def state(self, nodeId: str, model: str) -> ModelState:
        node = self._nodes.get(nodeId)
        return ModelState.UNKNOWN if node is None else self.rules(nodeId, node, model)


_node = st.sampled_from(NODES)
_model = st.sampled_from(MODELS)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("began"), _node, _model),
        st.tuples(st.just("ended"), _node, _model),
        st.tuples(st.just("loadStarted"), _node, _model),
        st.tuples(st.just("loadDone"), _node, _model),
        st.tuples(st.just("loadAbandoned"), _node, _model),
        st.tuples(st.just("coldFirstByte"), _node, _model),
        st.tuples(st.just("listed"), _node, st.frozensets(_model)),
        st.tuples(st.just("silent"), _node),
        st.tuples(st.just("advance"), st.floats(0.0, 40.0)),
    ),
    max_size=30,
)


class EarlyAnswerTests(SynchronousTestCase):
    """The early answer never differs from the full rules."""

    @settings(max_examples=300, deadline=None)
    @given(_steps)
    def test_sameStates(self, steps: list[tuple[object, ...]]) -> None:
        """After each step of a random history (our requests, our loads, probes that list
        models or say nothing of them, time passing), both give every node and model the
        same state."""
        clock = Clock()
        clock.advance(1_800_000_000.0)
        ledger = RoomLedger(clock, {})
        states = EngineStates(clock, ledger)
        views = [Residency(clock, states, ledger), _FullRules(clock, states, ledger)]
        for step in steps:
            self._apply(clock, states, views, step)
            for nodeId in NODES:
                for model in MODELS:
                    fast, full = (view.state(nodeId, model) for view in views)
                    self.assertIs(fast, full, (step, nodeId, model))

    def _apply(
        self, clock: Clock, states: EngineStates, views: list[Residency], step: tuple[object, ...]
    ) -> None:
        what = step[0]
        if what == "advance":
            assert isinstance(step[1], float)
            clock.advance(step[1])
            return
        nodeId = step[1]
        assert isinstance(nodeId, str)
        if what in ("listed", "silent"):
            listed = step[2] if what == "listed" else None
            assert listed is None or isinstance(listed, frozenset)
            report = (
                EngineReport(busy=0, total=2)
                if listed is None
                else EngineReport(
                    loaded=listed, resident=tuple(ResidentModel(m) for m in sorted(listed))
                )
            )
            states.record(nodeId, report, 1.0, "/api/ps")
            for view in views:
                view.observe(nodeId, report)
            return
        model = step[2]
        assert isinstance(model, str)
        for view in views:
            if what == "coldFirstByte":
                view.coldFirstByte(nodeId, model, 2.0)
            else:
                getattr(view, str(what))(nodeId, model)
