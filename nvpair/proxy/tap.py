"""``twistd nvpair-proxy``: the service maker (options in ``options``, process in ``service``)."""

from __future__ import annotations

import atexit
import gc
import signal
from typing import Any

from twisted.application.service import IService

from nvpair.proxy import eventloop
from nvpair.proxy.logoutlet import LineOutlet
from nvpair.proxy.logs import COMPONENT
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService, stderrStream

__all__ = ["Options", "makeService"]


def exitZeroOnSigterm(reactor: Any) -> None:
    """Make SIGTERM a clean stop with exit status 0 (protocol §1).

    twistd records the signal that stopped the reactor and re-raises it at exit, so the
    process would die of SIGTERM; clearing the record after shutdown makes it exit 0.
    """

    def clear() -> None:
        if getattr(reactor, "_exitSignal", None) == signal.SIGTERM:
            reactor._exitSignal = None

    reactor.addSystemEventTrigger("after", "shutdown", clear)


def freezeStartupObjects(reactor: Any) -> None:
    """Leave the objects built at startup out of the cycle collector's walks.

    The first-generation threshold stays at CPython's default: raised (tried at 20,000) it
    saved little CPU and made each collection long enough to show as multi-millisecond
    stalls in the latency tail.
    """
    reactor.callWhenRunning(gc.freeze)


def logOutlet() -> LineOutlet:
    """The log's stream: stderr, written by a thread so that a broker that stops reading
    stderr never stalls the reactor; given two seconds at exit to write what is left."""
    outlet = LineOutlet(stderrStream(), COMPONENT)
    atexit.register(outlet.close)
    return outlet


def makeService(options: Options) -> IService:
    """Build the process's service tree from parsed options."""
    reactor = eventloop.install()

    exitZeroOnSigterm(reactor)
    freezeStartupObjects(reactor)
    settings = options.settings
    assert settings is not None
    trust: Any = None
    if settings.clusterDir is not None:
        from nvpair.proxy.cluster import ClusterTrust

        service: list[ProxyService] = []
        trust = ClusterTrust(
            settings.clusterDir, reactor, lambda message: service[0].clusterProblem(message)
        )
        proxy = ProxyService(settings, reactor, logOutlet(), trust)
        service.append(proxy)
        return proxy
    return ProxyService(settings, reactor, logOutlet(), trust)
