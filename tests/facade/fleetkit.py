"""Shared by the fleet tests (``test_fleet_lists``, ``test_fleet_cors``) and the standalone
and node-state tests: a scripted upstream and its responses, a never-listening facade, and
``FleetCase``, which serves a facade's list routes and preflights through a ``Fleet``.

The facade's HTTP side is a real ``twisted.web`` site driven in memory by ``StubTreq``;
the upstream is a fake that answers per address; time is a ``Clock``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from treq.testing import StubTreq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.interfaces import IProtocol, IPushProducer, IReactorTime
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from twisted.web.resource import Resource
from zope.interface import implementer

from nvpair.proxy.engines import Engine
from nvpair.proxy.facade.enginepoller import EnginePoller
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.fleet import Fleet
from nvpair.proxy.interfaces import IUpstream
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.fakecontext import FakeContext

ORIGIN = "http://app.example"
DIAL = 2.0


@implementer(IPushProducer)
class FakeBody:
    """The body transport of a fake response: records stopProducing."""

    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


@implementer(IResponse)
class FakeResponse:
    """An ``IResponse`` with a body delivered at once (or never, when ``hold``)."""

    version = (b"HTTP", 1, 1)
    phrase = b"Phrase"
    length = UNKNOWN_LENGTH
    request = None
    previousResponse = None

    def __init__(
        self,
        code: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        hold: bool = False,
    ) -> None:
        self.code = code
        self.body = body
        self.headers = Headers({k: [v] for k, v in (headers or {}).items()})
        self.hold = hold
        self.transport = FakeBody()

    def setPreviousResponse(self, response: IResponse) -> None:
        pass

    def deliverBody(self, protocol: IProtocol) -> None:
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]
        if self.hold:
            return
        if self.body:
            protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))


@implementer(IUpstream)
class FakeUpstream:
    """Answers each address with a scripted response, failure, a Deferred the test fires,
    or (``"hang"``) a Deferred that never fires."""

    def __init__(self) -> None:
        self.script: dict[str, Any] = {}
        self.calls: list[tuple[str, str | None, bytes, bytes, Headers]] = []
        self.cancelled: list[str] = []

    def request(
        self,
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[Any]:
        self.calls.append((node.id, address, method, path, headers))
        answer = self.script.get(f"{address}{path.decode()}", self.script.get(address or ""))
        if answer is None or answer == "hang":
            return defer.Deferred(lambda d: self.cancelled.append(address or ""))
        if isinstance(answer, defer.Deferred):
            return answer  # the test fires it
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed(answer)


def _noFactory(aliasOnly: bool) -> ServerFactory:
    raise AssertionError("a fleet test facade never listens")


def fleetFacade(
    engine: Engine,
    nodes: list[Node],
    localBackend: str | None = None,
    pin: str | None = None,
) -> Facade:
    """A facade (never listening) with the state the fleet reads."""
    facade = Facade(engine, MemoryReactorClock(), _noFactory, Snapshot(nodes, engine.normalize))
    if localBackend is not None:
        facade.setLocalBackend(localBackend)
    facade.pin = pin
    return facade


class Client(Protocol):
    """The part of ``StubTreq`` these tests call (it sets its methods at run time)."""

    def request(self, method: str, url: str, **kwargs: Any) -> defer.Deferred[IResponse]: ...

    def get(self, url: str, **kwargs: Any) -> defer.Deferred[IResponse]: ...

    def content(self, response: IResponse) -> defer.Deferred[bytes]: ...

    def flush(self) -> None: ...


class FleetResource(Resource):
    """A leaf resource sending list routes and preflights to the fleet, as the front door does."""

    isLeaf = True

    def __init__(self, fleet: Fleet, facade: Facade) -> None:
        super().__init__()
        self.fleet = fleet
        self.facade = facade

    def render(self, request: Any) -> Any:
        if request.method == b"OPTIONS":
            self.fleet.preflight(self.facade, request)
        else:
            self.fleet.modelList(self.facade, request)
        return server.NOT_DONE_YET


def node(nodeId: str, *addresses: str, isSelf: bool = False) -> Node:
    """A discovery node (inventory is irrelevant to fleet views)."""
    return Node(nodeId, isSelf, addresses, frozenset())


def openaiList(owner: str, *ids: str) -> bytes:
    """An OpenAI list whose entries name ``owner``."""
    return json.dumps(
        {"object": "list", "data": [{"id": i, "owned_by": owner} for i in ids]}
    ).encode()


class FleetCase(SynchronousTestCase):
    """A ``Fleet`` over a ``FakeContext`` with a scripted upstream, served in memory."""

    def setUp(self) -> None:
        self.context = FakeContext(upstream=FakeUpstream(), logLevel="debug", dialTimeout=DIAL)
        self.fleet = Fleet(self.context)

    def serve(self, facade: Facade) -> Client:
        return cast(Client, StubTreq(FleetResource(self.fleet, facade)))

    def get(
        self, stub: Client, path: str, headers: dict[str, str] | None = None, method: str = "GET"
    ) -> tuple[Any, bytes]:
        d = stub.request(method, "http://proxy" + path, headers=headers)
        stub.flush()
        response = self.successResultOf(d)
        body = self.successResultOf(stub.content(response))
        return response, body

    def cors(self, response: Any) -> dict[str, str]:
        return {
            name.decode().lower(): b", ".join(values).decode()
            for name, values in response.headers.getAllRawHeaders()
            if name.lower().startswith(b"access-control-")
        }


def runningPoller(
    test: SynchronousTestCase,
    engine: Engine,
    urls: list[str],
    upstream: FakeUpstream,
    clock: IReactorTime,
    states: EngineStates,
    ledger: RoomLedger,
    active: Callable[[], bool],
    onReport: Callable[[str, EngineReport], None] | None = None,
) -> EnginePoller:
    """An ``EnginePoller`` of ``urls`` started for ``test``, stopped at its cleanup."""
    poller = EnginePoller(
        engine, urls, upstream, clock, states, ledger, active=active, onReport=onReport
    )
    return started(test, poller)


S = TypeVar("S", bound=Service)


def started(test: SynchronousTestCase, service: S) -> S:
    """``service`` started for ``test``, and stopped at its cleanup unless it already is."""
    service.startService()

    def stop() -> None:
        if service.running:
            service.stopService()

    test.addCleanup(stop)
    return service
