"""A fake standalone process (what ``startStandalone`` uses) whose facades never listen and
record the snapshots their pollers publish."""

from __future__ import annotations

from twisted.application.service import MultiService
from twisted.internet.protocol import ServerFactory
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from zope.interface import implementer

from nvpair.proxy.engines import LLAMACPP, Engine
from nvpair.proxy.facade.facade import BindError, Facade
from nvpair.proxy.facade.standalone import (
    IStandaloneProcess,
)
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.settings import Settings
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.facade.fleetkit import FakeUpstream

TIMEOUT = 12.0


def _noFactory(aliasOnly: bool) -> ServerFactory:
    raise AssertionError("a standalone test facade never listens")


class RecordingFacade(Facade):
    """A facade (never listening) that records the snapshots a poller publishes."""

    def __init__(self, engine: Engine = LLAMACPP) -> None:
        super().__init__(
            engine,
            MemoryReactorClock(),
            _noFactory,
            Snapshot((), engine.normalize),
        )
        self.snapshots: list[Snapshot] = []

    def setSnapshot(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def inventories(self) -> dict[str, list[str]]:
        """The latest snapshot as node id → sorted models."""
        last = self.snapshots[-1]
        return {n.id: sorted(n.models) for n in last.nodes}


@implementer(IStandaloneProcess)
class FakeService(MultiService):
    """The process as ``startStandalone`` uses it (``ProxyService`` in production)."""

    def __init__(
        self,
        engines: tuple[str, ...],
        backends: tuple[tuple[str, str], ...],
        refuse: frozenset[str] = frozenset(),
        affinity: str = "off",
        fleetFile: str | None = None,
    ) -> None:
        super().__init__()
        self.context = FakeContext(
            upstream=FakeUpstream(),
            engines=engines,
            backends=backends,
            dialTimeout=1.0,
            affinity=affinity,
            fleetFile=fleetFile,
        )
        self.metrics = Metrics()
        self.refuse = refuse
        self.enabled: list[tuple[str, int]] = []
        self.problems: list[tuple[str, str, str]] = []
        self.facades: dict[str, RecordingFacade] = {}

    @property
    def settings(self) -> Settings:
        return self.context.settings

    @property
    def clock(self) -> Clock:
        return self.context.clock

    @property
    def reservations(self) -> ReservationMap:
        return self.context.reservations

    @property
    def affinity(self) -> Affinity | None:
        """The context's (what the status view reads)."""
        return self.context.affinity

    def enableFacade(
        self, engine: Engine, port: int, aliases: list[str], ignorePersisted: bool
    ) -> RecordingFacade:
        if engine.id in self.refuse:
            raise BindError(port, "Address already in use")
        self.enabled.append((engine.id, port))
        facade = RecordingFacade(engine)
        self.facades[engine.id] = facade
        return facade

    def facadeProblem(self, engineId: str, kind: str, message: str) -> None:
        self.problems.append((engineId, kind, message))
