"""What the operations listener reads of the process, as an interface.

The listener, its documents and its gauges read the process's live state at request (or
scrape) time.  ``IOpsView`` names exactly what they read, so this package never imports
the service that provides it (``ProxyService`` declares it); the types are those of the
lower modules that own each part of the state, imported for the type checker only (loading
this interface loads none of them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from twisted.application.service import IServiceCollection
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from nvpair.proxy.broker.activity import Activity
    from nvpair.proxy.broker.workloads import WorkloadReporter
    from nvpair.proxy.dispatch.queueing import Queueing
    from nvpair.proxy.dispatch.upstream import Upstream
    from nvpair.proxy.facade.facade import Facade
    from nvpair.proxy.facade.hostcheck import HostGate
    from nvpair.proxy.nodestate.states import EngineStates
    from nvpair.proxy.ops.history import History
    from nvpair.proxy.ops.metrics import Metrics
    from nvpair.proxy.placement.affinity import Affinity
    from nvpair.proxy.routing.reservations import ReservationMap
    from nvpair.proxy.settings import Settings


class IOpsContext(Interface):
    """What the operations listener reads of the process's request context
    (``context.RequestContext``): the live state requests update."""

    settings: Settings = Attribute("The process's parsed settings.")
    clock: IReactorTime = Attribute("The reactor's clock.")
    reservations: ReservationMap = Attribute("The reservation map and scheduler view.")
    activity: Activity = Attribute("In-flight dispatch counts per node.")
    reporter: WorkloadReporter = Attribute("Workload counts and recent ends.")
    history: History = Attribute("The last 15 minutes of traffic per facade and node.")
    exchanges: Collection[object] = Attribute("The requests being dispatched or streamed.")
    affinity: Affinity | None = Attribute("Conversation affinity, or None where it is off.")
    engineStates: EngineStates | None = Attribute(
        "The engines' own state (standalone mode), or None under a broker."
    )
    queueing: Queueing | None = Attribute(
        "Standalone flow control (the fair queue, the node breakers), or None under a broker."
    )


class IOpsView(IServiceCollection):
    """The process as the operations listener sees it.

    It is a service collection: the listener runs as one of its children, and a
    standalone facade's inventory poller is found among them by name.
    """

    settings: Settings = Attribute("The process's parsed settings.")
    reactor: IReactorTCP = Attribute("The reactor the listener binds its port with.")
    context: IOpsContext = Attribute("The request context: what requests update.")
    facades: Mapping[str, Facade] = Attribute("The enabled facades by engine id.")
    metrics: Metrics = Attribute("The event metrics the request path feeds.")
    hosts: HostGate = Attribute("The loopback ``Host`` rule the listener applies too.")
    upstream: Upstream = Attribute("The connector to nodes (its pool is counted).")
