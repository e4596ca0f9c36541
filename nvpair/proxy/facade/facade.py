"""One facade per enabled engine: listeners and its slice of broker state (spec §3, §7, §8).

The facade owns the primary listener (all interfaces, first-byte personality switch), the
loopback alias listeners, the discovery snapshot, the manual pin and the local backend.
Dispatch reads that state through the facade; nothing else writes it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.internet.protocol import ServerFactory
from twisted.logger import Logger
from zope.interface import Attribute, Interface, implementer

from nvpair.proxy.dispatch.interfaces import IFacadeView
from nvpair.proxy.engines import Engine
from nvpair.proxy.routing.candidates import Snapshot


class BindError(Exception):
    """The facade's port could not be bound; ``reason`` is the operating system's words."""

    def __init__(self, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on port {port}: {reason}")
        self.port = port
        self.reason = reason


def parseAlias(text: object) -> int:
    """Validate an alias address ``127.0.0.1:PORT`` (loopback only) and return its port."""
    if not isinstance(text, str):
        raise ValueError("alias must be a string 127.0.0.1:PORT")
    host, sep, port = text.rpartition(":")
    if not sep or host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError("alias must be a loopback address 127.0.0.1:PORT")
    value = int(port)
    if not 1 <= value <= 65535:
        raise ValueError("alias port must be 1..65535")
    return value


def _reason(e: CannotListenError) -> str:
    err = e.socketError
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err)


def _stopped(listener: IListeningPort) -> defer.Deferred[None]:
    result = listener.stopListening()
    if isinstance(result, defer.Deferred):
        return result.addCallback(lambda _: None)
    return defer.succeed(None)


class Watcher(Protocol):
    """Something to tell when a node leaves discovery (an attempt to it)."""

    def left(self) -> None:
        """The watched node left the discovery snapshot."""


class FacadeState(Enum):
    """Where a facade is in its life."""

    CREATED = "created"
    """Built, nothing bound yet."""
    LISTENING = "listening"
    """The primary port is bound (aliases as far as they could be)."""
    STOPPED = "stopped"
    """Every listener is closed; discovery waiters were cancelled."""


@implementer(IFacadeView)
class Facade(Service):
    """An engine's facade: listeners plus the discovery, pin and local-backend state."""

    log = Logger()

    def __init__(
        self,
        engine: Engine,
        reactor: IReactorTCP,
        makeFactory: Callable[[bool], ServerFactory],
        emptySnapshot: Snapshot,
    ) -> None:
        self.engine = engine
        self.name = engine.id
        self.state = FacadeState.CREATED
        self._reactor = reactor
        self._makeFactory = makeFactory
        self.snapshot = emptySnapshot
        self.snapshotCount = 0
        self.pin: str | None = None
        self.confirmed: dict[str, str] = {}
        self.localBackend: str | None = None
        self.port: int | None = None
        self.aliases: list[str] = []
        self._listener: IListeningPort | None = None
        self._aliasListeners: list[IListeningPort] = []
        self._waiters: list[defer.Deferred[None]] = []
        # node id -> the watchers of that node (a dict: an ordered set)
        self._watchers: dict[str, dict[Watcher, None]] = {}

    # -- listeners ----------------------------------------------------------------------

    def _bindPrimary(self, port: int) -> IListeningPort:
        factory = self._makeFactory(False)
        try:
            return self._reactor.listenTCP(port, factory, interface="::")
        except CannotListenError as e:
            err = e.socketError
            if isinstance(err, OSError) and err.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                try:
                    return self._reactor.listenTCP(port, factory, interface="0.0.0.0")
                except CannotListenError as e2:
                    raise BindError(port, _reason(e2)) from None
            raise BindError(port, _reason(e)) from None

    def listen(self, port: int, aliases: list[str]) -> list[tuple[str, str]]:
        """Bind the primary port (raising ``BindError``) then each alias; returns alias problems."""
        self._listener = self._bindPrimary(port)
        self.port = port
        self.state = FacadeState.LISTENING
        problems: list[tuple[str, str]] = []
        for alias in aliases:
            aliasPort = parseAlias(alias)
            try:
                listener = self._reactor.listenTCP(
                    aliasPort, self._makeFactory(True), interface="127.0.0.1"
                )
            except CannotListenError as e:
                problems.append((alias, _reason(e)))
                continue
            self._aliasListeners.append(listener)
            self.aliases.append(f"127.0.0.1:{aliasPort}")
        return problems

    def move(self, port: int) -> defer.Deferred[None]:
        """Bind ``port`` first (raising ``BindError``), then close the old primary listener."""
        if port == self.port:
            return defer.succeed(None)
        new = self._bindPrimary(port)
        old, self._listener, self.port = self._listener, new, port
        if old is None:
            return defer.succeed(None)
        return _stopped(old)

    def stopService(self) -> defer.Deferred[None]:
        """Close every listener of this facade."""
        super().stopService()
        self.state = FacadeState.STOPPED
        listeners = [lst for lst in [self._listener, *self._aliasListeners] if lst is not None]
        self._listener = None
        self._aliasListeners = []
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters = []
        return defer.gatherResults(
            [_stopped(lst) for lst in listeners], consumeErrors=True
        ).addCallback(lambda _: None)

    # -- discovery view -----------------------------------------------------------------

    @property
    def hasLocalBackend(self) -> bool:
        """Whether a self node can be reached (a local backend is known)."""
        return self.localBackend is not None

    def setSnapshot(self, snapshot: Snapshot) -> None:
        """Replace the discovery snapshot; cancel attempts to nodes that left; wake waiters."""
        self.snapshot = snapshot
        self.snapshotCount += 1
        gone = [nodeId for nodeId in self._watchers if nodeId not in snapshot]
        for nodeId in gone:
            for watcher in list(self._watchers.pop(nodeId, ())):
                watcher.left()
        self._wake()

    def setLocalBackend(self, url: str) -> None:
        """Record where this node's own engine listens; a waiting request may now have an owner."""
        self.localBackend = url.rstrip("/")
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def nextSnapshot(self) -> defer.Deferred[None]:
        """Fires when discovery next changes (a new snapshot or local backend)."""
        d: defer.Deferred[None] = defer.Deferred(lambda d: self._dropWaiter(d))
        self._waiters.append(d)
        return d

    def _dropWaiter(self, d: defer.Deferred[None]) -> None:
        try:
            self._waiters.remove(d)
        except ValueError:
            pass

    def watch(self, nodeId: str, watcher: Watcher) -> None:
        """Call ``watcher.left()`` if ``nodeId`` leaves discovery (until ``unwatch``)."""
        watchers = self._watchers.get(nodeId)
        if watchers is None:
            self._watchers[nodeId] = {watcher: None}
        else:
            watchers[watcher] = None

    def unwatch(self, nodeId: str, watcher: Watcher) -> None:
        """Stop watching ``nodeId`` for ``watcher``; a no-op when it is not watching."""
        watchers = self._watchers.get(nodeId)
        if watchers is not None and watchers.pop(watcher, 0) is None and not watchers:
            del self._watchers[nodeId]


class IFacadeHost(Interface):
    """What enables facades and hears their problems: the process (``service.ProxyService``).

    The broker's ``facade/enable`` handler and standalone mode both enable facades; the
    process does it, since it owns the listeners' factories and the service tree.
    """

    facades: dict[str, Facade] = Attribute("The enabled facades by engine id.")

    def enableFacade(
        engine: Engine, port: int, aliases: list[str], ignorePersisted: bool
    ) -> Facade:
        """Create, bind and start a facade; raises ``BindError`` with nothing left bound."""

    def facadeProblem(engineId: str, kind: str, message: str) -> None:
        """Report a non-fatal facade problem (``<engine>:errors:report``)."""
