"""``twistd nvpair-proxy``: the service maker (options in ``options``, process in ``service``)."""

from __future__ import annotations

import atexit
import gc
import signal
from collections.abc import Callable
from types import FrameType
from typing import cast

from twisted.application.service import IService
from twisted.internet.error import ReactorNotRunning
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.posixbase import PosixReactorBase

from nvpair.proxy.facade.reload import reloadFrom, reloadOnSighup
from nvpair.proxy.options import Options
from nvpair.proxy.runtime.logoutlet import LineOutlet
from nvpair.proxy.runtime.logs import COMPONENT, FORMATS
from nvpair.proxy.service import ProxyService, stderrStream

__all__ = ["Options", "makeService"]


SignalHandler = Callable[[int, FrameType | None], object]


def exitZeroOnSigterm(
    reactor: IReactorCore,
    setHandler: Callable[[int, SignalHandler], object] = signal.signal,
) -> None:
    """Make SIGTERM a clean stop with exit status 0 (protocol §1).

    The reactor's own SIGTERM handler records the signal, and twistd re-raises a recorded
    signal at exit, so the process would die of SIGTERM.  Once the reactor runs (its
    handlers are in place by then), SIGTERM gets a handler of ours instead: it stops the
    reactor the same way, from the signal-safe thread-call queue, and records nothing, so
    the process runs its shutdown and exits 0.
    """

    fromThreads = IReactorFromThreads(reactor)

    def stop() -> None:
        try:
            reactor.stop()
        except ReactorNotRunning:
            pass  # a second SIGTERM during shutdown

    def onSigterm(signum: int, frame: FrameType | None) -> None:
        fromThreads.callFromThread(stop)

    reactor.callWhenRunning(setHandler, signal.SIGTERM, onSigterm)


def freezeStartupObjects(reactor: IReactorCore) -> None:
    """Leave the objects built at startup out of the cycle collector's walks.

    The first-generation threshold stays at CPython's default: raised (tried at 20,000) it
    saved little CPU and made each collection long enough to show as multi-millisecond
    stalls in the latency tail.
    """
    reactor.callWhenRunning(gc.freeze)


def logOutlet(form: str = "json") -> LineOutlet:
    """The log's stream: stderr, written by a thread so that a broker that stops reading
    stderr never stalls the reactor; given two seconds at exit to write what is left."""
    outlet = LineOutlet(stderrStream(), COMPONENT, render=FORMATS[form])
    atexit.register(outlet.close)
    return outlet


def installedReactor() -> PosixReactorBase:
    """The reactor twistd installed (``--reactor``; Twisted's default without it): every
    reactor Twisted installs on Linux (epoll, poll, select, asyncio, ``nvpair``) is a
    ``PosixReactorBase``, the type the process uses it as (TCP, time, processes)."""
    from twisted.internet import reactor

    return cast(PosixReactorBase, reactor)


def makeService(options: Options) -> IService:
    """Build the process's service tree from parsed options (installing no reactor: twistd
    did, see ``runtime.eventloop``)."""
    reactor = installedReactor()

    exitZeroOnSigterm(reactor)
    freezeStartupObjects(reactor)
    settings = options.settings
    assert settings is not None
    proxy = ProxyService(settings, reactor, logOutlet(settings.logFormat))
    reloadOnSighup(reactor, lambda: reloadFrom(proxy))  # systemctl reload (the fleet file)
    return proxy
