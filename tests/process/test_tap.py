"""Unit tests of the service maker's process-wide settings (``tap``)."""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable
from typing import Any, ParamSpec, cast

from twisted.application.reactors import IReactorInstaller, Reactor
from twisted.internet.error import ReactorNotRunning
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.testing import MemoryReactor
from twisted.plugin import getPlugins
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.main import twistdArguments
from nvpair.proxy.tap import exitZeroOnSigterm, freezeStartupObjects

_P = ParamSpec("_P")


@implementer(IReactorFromThreads)
class StartupReactor(MemoryReactor):
    """A running memory reactor that records what is scheduled for when it runs, thread
    calls and stops."""

    def __init__(self) -> None:
        super().__init__()
        self.atStart: list[Any] = []
        self.threadCalls: list[Callable[[], object]] = []
        self.stops = 0
        self.running = True

    def callWhenRunning(
        self, callable: Callable[_P, object], *args: _P.args, **kw: _P.kwargs
    ) -> None:
        self.atStart.append((callable, *args) if args else callable)

    def callFromThread(
        self, callable: Callable[_P, object], *args: _P.args, **kw: _P.kwargs
    ) -> None:
        self.threadCalls.append(lambda: callable(*args, **kw))

    def stop(self) -> None:
        if not self.running:
            raise ReactorNotRunning("already stopping")
        self.running = False
        self.stops += 1


class FakeTests(SynchronousTestCase):
    """The fake reactor provides what the service maker uses it through."""

    def test_interfaces(self) -> None:
        """A core reactor that takes calls from other threads."""
        reactor = StartupReactor()
        self.assertTrue(verifyObject(IReactorCore, reactor))
        self.assertTrue(verifyObject(IReactorFromThreads, reactor))


class SigtermTests(SynchronousTestCase):
    """SIGTERM stops the reactor without leaving twistd a signal to re-raise at exit."""

    def setUp(self) -> None:
        self.reactor = StartupReactor()
        self.handlers: dict[int, Any] = {}
        exitZeroOnSigterm(self.reactor, self.handlers.__setitem__)

    def sigterm(self) -> None:
        """Deliver SIGTERM to the installed handler and run the thread calls it queued."""
        self.handlers[signal.SIGTERM](signal.SIGTERM, None)
        calls, self.reactor.threadCalls = self.reactor.threadCalls, []
        for call in calls:
            call()

    def test_installedOnceRunning(self) -> None:
        """The handler replaces the reactor's only once the reactor runs (after its own)."""
        self.assertEqual(self.handlers, {})
        self.assertEqual(len(self.reactor.atStart), 1)
        setHandler, signum, handler = self.reactor.atStart[0]
        self.assertEqual(signum, signal.SIGTERM)
        setHandler(signum, handler)
        self.assertEqual(list(self.handlers), [signal.SIGTERM])

    def test_sigtermStopsFromTheThreadQueue(self) -> None:
        """The handler itself only queues the stop; running the queue stops the reactor."""
        setHandler, signum, handler = self.reactor.atStart[0]
        setHandler(signum, handler)
        handler(signal.SIGTERM, None)
        self.assertEqual(self.reactor.stops, 0)
        self.assertEqual(len(self.reactor.threadCalls), 1)
        self.reactor.threadCalls.pop()()
        self.assertEqual(self.reactor.stops, 1)

    def test_secondSigtermDuringShutdown(self) -> None:
        """A second SIGTERM while the reactor is stopping is absorbed, not an error."""
        setHandler, signum, handler = self.reactor.atStart[0]
        setHandler(signum, handler)
        self.sigterm()
        self.sigterm()
        self.assertEqual(self.reactor.stops, 1)


class CollectorTests(SynchronousTestCase):
    """The objects built at startup are left out of cycle collections."""

    def setUp(self) -> None:
        self.addCleanup(gc.unfreeze)

    def test_startupObjectsFrozen(self) -> None:
        """Once the reactor runs, everything built at startup leaves the collector's walks."""
        reactor = StartupReactor()
        freezeStartupObjects(reactor)
        self.assertEqual(reactor.atStart, [gc.freeze])
        reactor.atStart[0]()
        self.assertGreater(gc.get_freeze_count(), 0)


class CommandTests(SynchronousTestCase):
    """The console command is twistd on the proxy's reactor, chosen by name."""

    def test_reactorByName(self) -> None:
        """``nvpair-proxy ARGS`` is ``twistd --reactor=nvpair -n --pidfile= nvpair-proxy ARGS``."""
        self.assertEqual(
            twistdArguments(["--standalone"]),
            ["--reactor=nvpair", "--nodaemon", "--pidfile=", "nvpair-proxy", "--standalone"],
        )

    def test_reactorPlugin(self) -> None:
        """The ``nvpair`` reactor plugin installs ``runtime.eventloop``."""
        found = {p.shortName: p for p in getPlugins(IReactorInstaller)}
        self.assertIsInstance(found["nvpair"], Reactor)
        self.assertEqual(
            cast(Reactor, found["nvpair"]).moduleName, "nvpair.proxy.runtime.eventloop"
        )
