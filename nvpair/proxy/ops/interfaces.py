"""What the operations listener reads of the process, as an interface.

The listener, its documents and its gauges read the process's live state at request (or
scrape) time.  ``IOpsView`` names exactly what they read, so this package never imports
the service that provides it (``ProxyService`` declares it); the types are those of the
lower modules that own each part of the state.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from twisted.application.service import IServiceCollection
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from zope.interface import Attribute

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.hostcheck import HostGate
from nvpair.proxy.interfaces import IRequestContext
from nvpair.proxy.ops.history import History
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.options import Settings
from nvpair.proxy.routing.affinity import Affinity
from nvpair.proxy.routing.reservations import ReservationMap


class IOpsView(IServiceCollection):
    """The process as the operations listener sees it.

    It is a service collection: the listener runs as one of its children, and a
    standalone facade's inventory poller is found among them by name.
    """

    settings: Settings = Attribute("The process's parsed settings.")
    reactor: IReactorTCP = Attribute("The reactor the listener binds its port with.")
    clock: IReactorTime = Attribute("The reactor's clock.")
    reservations: ReservationMap = Attribute("The reservation map and scheduler view.")
    activity: Activity = Attribute("In-flight dispatch counts per node.")
    reporter: WorkloadReporter = Attribute("Workload counts and recent ends.")
    history: History = Attribute("The last 15 minutes of traffic per facade and node.")
    facades: Mapping[str, Facade] = Attribute("The enabled facades by engine id.")
    exchanges: Collection[object] = Attribute("The requests being dispatched or streamed.")
    metrics: Metrics = Attribute("The event metrics the request path feeds.")
    hosts: HostGate = Attribute("The loopback ``Host`` rule the listener applies too.")
    upstream: Upstream = Attribute("The connector to nodes (its pool is counted).")
    affinity: Affinity | None = Attribute("Conversation affinity, or None where it is off.")
    context: IRequestContext = Attribute("The request context (standalone's ``queueing``).")
