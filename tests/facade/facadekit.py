"""Shared by the facade message tests (``test_facade_enable``, ``test_facade_messages``).

A memory reactor whose ``listenTCP`` can be made to fail (``BusyReactor``), its fake
listening ports, and ``FacadeCase``: a real ``ProxyService`` on that reactor, handling
broker messages the way the channel does.  ``BusyReactor`` is also what the broker and
admission fuzzers listen on.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

from twisted.internet.address import IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.broker.channel import Reply, RPCError
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.fakecontext import ListSink


@implementer(IListeningPort)
class Port:
    """A fake listening port that remembers whether it was closed."""

    def __init__(self, reactor: BusyReactor, port: int, interface: str) -> None:
        self.reactor = reactor
        self.port = port
        self.interface = interface
        self.closed = False

    def startListening(self) -> None:
        pass

    def stopListening(self) -> None:
        self.closed = True
        self.reactor.open.discard((self.interface, self.port))

    def getHost(self) -> IPv6Address:
        return IPv6Address("TCP", self.interface, self.port)


class BusyReactor(MemoryReactorClock):
    """A memory reactor whose listenTCP fails on ports marked busy."""

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()
        self.open: set[tuple[str, int]] = set()
        self.ports: list[Port] = []

    def listenTCP(
        self, port: int, factory: ServerFactory, backlog: int = 50, interface: str = ""
    ) -> Port:
        if port in self.busy or (interface, port) in self.open:
            raise CannotListenError(
                interface, port, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
            )
        self.tcpServers.append((port, factory, backlog, interface))
        p = Port(self, port, interface)
        self.open.add((interface, port))
        self.ports.append(p)
        return p


class FacadeCase(SynchronousTestCase):
    """A ``ProxyService`` on a ``BusyReactor``; messages go through ``ProxyService.handle``."""

    def setUp(self) -> None:
        self.stateDir = tempfile.mkdtemp(prefix="nvpair-facade-")
        options = Options({})
        options.parseOptions(["--state-dir", self.stateDir])
        assert options.settings is not None
        self.reactor = BusyReactor()
        self.service = ProxyService(options.settings, self.reactor)
        self.sink = ListSink()
        self.service.sinks.target = self.sink

    def call(self, engine: str | None, name: str, params: dict[str, Any]) -> Any:
        """Handle a message the way the channel does: answer, then run ``after``."""
        outcome = self.service.handlers.handle(engine, name, params)
        if isinstance(outcome, Reply):
            self.sink.sent.append(("<result>", outcome.value))  # type: ignore[arg-type]
            outcome.after()
            return outcome.value
        return outcome

    def error(self, engine: str | None, name: str, params: dict[str, Any]) -> RPCError:
        with self.assertRaises(RPCError) as cm:
            self.call(engine, name, params)
        e: RPCError = cm.exception
        return e

    def listening(self) -> list[int]:
        return sorted(port for _, port in self.reactor.open)
