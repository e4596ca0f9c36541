"""What the unit tests of the request path build around the kit's seam fakes: discovery
nodes, a facade holding them, and an exchange started on a ``FakeRequest``.

The upstream is the kit's ``nvpair.proxy.testing.upstreamspy`` (every request a
``UpstreamCall`` the test answers by hand), the context its ``testing.fakecontext``.
Everything runs on a ``Clock``: no sockets, no real time.
"""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.dispatch.interfaces import IFacadeView
from nvpair.proxy.engines import ENGINES, RouteClass
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.frontdoor import promptKeyer
from nvpair.proxy.interfaces import IRequestContext
from nvpair.proxy.routing.admission import factsOf, readBody
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.facts import NO_FACTS
from nvpair.proxy.routing.nodes import Node
from tests.support.fakerequest import FakeRequest


def node(
    nodeId: str,
    models: tuple[str, ...] = ("m1",),
    isSelf: bool = False,
    addresses: tuple[str, ...] | None = None,
) -> Node:
    """A discovery node reached directly at ``http://<id>``."""
    if addresses is None:
        addresses = (f"http://{nodeId}",)
    return Node(nodeId, isSelf, addresses, frozenset(models))


def makeFacade(clock: Clock, nodes: list[Node], engine: str = "llamacpp") -> Facade:
    """A facade (never listening) holding a snapshot of ``nodes``."""
    e = ENGINES[engine]
    facade = Facade(e, clock, lambda aliasOnly: None, Snapshot((), e.normalize))  # type: ignore[arg-type, return-value]
    facade.setSnapshot(Snapshot(nodes, e.normalize))
    return facade


def setNodes(facade: Facade, nodes: list[Node]) -> None:
    """Replace the facade's discovery snapshot."""
    facade.setSnapshot(Snapshot(nodes, facade.engine.normalize))


CHAT = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def startExchange(
    context: IRequestContext,
    facade: IFacadeView,
    request: FakeRequest | None = None,
    inference: bool = True,
    model: str | None = "m1",
    body: bytes = CHAT,
    routeClass: RouteClass | None = None,
) -> tuple[Exchange, FakeRequest]:
    """Admit one request as the front door does (its facts and, where placement reads
    them, its prompt digests; ``model`` as given) and start its dispatch loop (an inference
    request unless ``inference`` is False, which makes it verbatim, or ``routeClass`` says
    otherwise)."""
    request = request or FakeRequest()
    if routeClass is None:
        routeClass = RouteClass.INFERENCE if inference else RouteClass.VERBATIM
    facts, key = NO_FACTS, None
    fields, whole = readBody(body)
    if routeClass is RouteClass.INFERENCE and fields is not None:
        facts = factsOf(fields)
        keyer = promptKeyer(context, facade, request)
        if keyer is not None and whole and model is not None:
            key = keyer(model, fields)
    exchange = Exchange(context, facade, request, routeClass, model, body, facts, key)
    exchange.start()
    return exchange, request
