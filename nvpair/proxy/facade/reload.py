"""Live reload of the standalone fleet file (protocol §9; spec §11, "The fleet file").

``FleetReloader`` owns the fleet file: it loads it at start, and again on SIGHUP or when the
file's identity (device, inode, size, modification time) changed.  Either way the file is
read only once it is *quiet*: its identity unchanged for ``QUIET`` seconds (watched every
``RELOAD_POLL``), and unchanged again after the read; so a file still being written (a
writer that truncated it and has written part of it) is not applied, even when the part is
valid TOML.  A file replaced atomically (written beside it, then renamed over it) is whole
from the start; that is the way to write it (README).  A valid file is switched to at once,
in one reactor turn: every ``IFleetFollower``
registered for an engine (the inventory poller, and whatever else follows the fleet) is
told that engine's new backends, and every clients follower (the queue) the declared
clients.  An invalid file changes nothing; its one-line error is
logged once per distinct error, counted, and kept for ``/status`` and the page until a
valid file is loaded.  Everything runs on the reactor: the SIGHUP handler only schedules
``reload`` there.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from enum import Enum
from types import FrameType

import attrs
from twisted.application.service import IServiceCollection, Service
from twisted.internet import task
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorTime
from twisted.logger import Logger
from zope.interface import Interface, implementer

from nvpair.proxy.facade.fleetfile import Backend, FleetError, FleetSpec, loadFleet
from nvpair.proxy.flow.clients import DeclaredClient

RELOAD_POLL = 1.0
QUIET = 2.0
"""Seconds a changed fleet file must hold still before it is read (two polls)."""
SERVICE_NAME = "fleet-file"

Fingerprint = tuple[int, int, int, int] | None


class ReloadResult(Enum):
    """What one reload did; the values are the ``result`` label of
    ``nvpair_proxy_fleet_reloads_total`` and the keys of ``/status``'s ``fleet.reloads``."""

    APPLIED = "applied"  # a valid, different file: switched to
    UNCHANGED = "unchanged"  # a valid file equal to the one in use
    INVALID = "invalid"  # refused: nothing changed
    WAITING = "waiting"  # the file changed while it was read: read again once quiet


COUNTED = (ReloadResult.APPLIED, ReloadResult.UNCHANGED, ReloadResult.INVALID)
"""The results counted (``WAITING`` is not: the reload it defers is counted once done)."""


class IFleetFollower(Interface):
    """Something that follows one engine's standalone fleet (register with
    ``FleetReloader.follow``): told the new set on every applied reload."""

    def setBackends(backends: Sequence[Backend]) -> None:
        """The engine's backends are now ``backends`` (enabled ones, in file order)."""


@implementer(IFleetFollower)
class UrlFollower:
    """Adapts a follower that wants only the URLs (``setBackends(urls)``) to the hook."""

    def __init__(self, setUrls: Callable[[Sequence[str]], object]) -> None:
        self.setUrls = setUrls

    def setBackends(self, backends: Sequence[Backend]) -> None:
        self.setUrls([b.url for b in backends])


@attrs.frozen
class ReloadError:
    """The last refused fleet file: its one line, the line number, and when (seconds)."""

    message: str
    line: int
    at: float


def fingerprint(path: str, stat: Callable[[str], os.stat_result] = os.stat) -> Fingerprint:
    """What identifies the file's current content cheaply, or None when it cannot be stat'd."""
    try:
        st = stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FleetReloader(Service):
    """Loads, watches and reloads the fleet file; tells the followers of each engine."""

    log = Logger()
    name = SERVICE_NAME

    def __init__(
        self,
        path: str,
        clock: IReactorTime,
        enableEngine: Callable[[str, Sequence[Backend]], bool],
        reorder: Callable[[Sequence[str]], None],
        counted: Callable[[ReloadResult], None],
        interval: float = RELOAD_POLL,
        stat: Callable[[str], os.stat_result] = os.stat,
        load: Callable[[str], FleetSpec] = loadFleet,
        quiet: float = QUIET,
    ) -> None:
        self.path = path
        self.clock = clock
        self.enableEngine = enableEngine
        self.reorder = reorder
        self.counted = counted
        self.interval = interval
        self.stat = stat
        self.load = load
        self.quiet = quiet
        self.spec: FleetSpec | None = None
        self.generation = 0
        self.loadedAt: float | None = None
        self.error: ReloadError | None = None
        self.results = dict.fromkeys(COUNTED, 0)
        self.followers: dict[str, list[IFleetFollower]] = {}
        self.clientFollowers: list[Callable[[Sequence[DeclaredClient]], object]] = []
        self.serving: dict[str, tuple[Backend, ...]] = {}  # enabled engines, in order
        self._loaded: Fingerprint = None
        self._seen: Fingerprint = None  # the identity last seen, and since when (clock)
        self._seenAt = 0.0
        self._waiting: str | None = None  # a reload's trigger, waiting for a quiet file
        self._loop: task.LoopingCall | None = None

    def follow(self, engineId: str, follower: IFleetFollower) -> None:
        """Tell ``follower`` ``engineId``'s backends on every applied reload (the one hook)."""
        self.followers.setdefault(engineId, []).append(follower)

    def followClients(self, setClients: Callable[[Sequence[DeclaredClient]], object]) -> None:
        """Tell ``setClients`` the declared clients (``[[client]]``) on every applied load."""
        self.clientFollowers.append(setClients)

    def first(self, fallbackEngines: Sequence[str]) -> None:
        """The load at start: the file (validated moments ago by the options) or, if it
        turned bad since, ``fallbackEngines`` with no backends until a valid file comes."""
        self._loaded = self._seen = fingerprint(self.path, self.stat)
        self._seenAt = self.clock.seconds()
        try:
            spec = self.load(self.path)
        except FleetError as e:
            self._refuse(e)
            for engineId in fallbackEngines:
                if self.enableEngine(engineId, ()):
                    self.serving[engineId] = ()
            return
        self._apply(spec)

    def startService(self) -> None:
        """Watch the file's identity every ``interval`` seconds."""
        super().startService()
        loop = self._loop = task.LoopingCall(self._tick)
        loop.clock = self.clock
        loop.start(self.interval, now=False).addErrback(
            lambda f: self.log.failure("fleet-watch-crashed", f)
        )

    def stopService(self) -> None:
        """Stop watching."""
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _see(self, current: Fingerprint) -> None:
        """Note the file's identity now; a new one starts its quiet time."""
        if current != self._seen:
            self._seen, self._seenAt = current, self.clock.seconds()

    def _quiet(self) -> bool:
        """Look at the file: whether its identity has held still for ``quiet`` seconds."""
        self._see(fingerprint(self.path, self.stat))
        return self.clock.seconds() - self._seenAt >= self.quiet

    def _tick(self) -> None:
        """Reload a changed file, or one a signal asked for, once it is quiet."""
        quiet = self._quiet()
        if (self._waiting is not None or self._seen != self._loaded) and quiet:
            trigger, self._waiting = self._waiting or "file-changed", None
            self.reload(trigger)

    def signalled(self) -> None:
        """SIGHUP: reload now if the file is quiet, else once it is (the watch does it)."""
        if self._quiet():
            self._waiting = None
            self.reload("signal")
        else:
            self._wait("signal", "the file changed in the last seconds")

    def _wait(self, trigger: str, reason: str) -> None:
        self._waiting = trigger
        self.log.info("fleet-reload-waiting", trigger=trigger, reason=reason, quiet=self.quiet)

    def reload(self, trigger: str) -> ReloadResult:
        """Load the file and switch to it if valid; the result: applied, unchanged, invalid,
        or waiting (the file changed while it was read: read again once quiet, uncounted)."""
        before = fingerprint(self.path, self.stat)  # taken first: a write after it is seen
        try:
            spec: FleetSpec | FleetError = self.load(self.path)
        except FleetError as e:
            spec = e
        after = fingerprint(self.path, self.stat)
        if after != before:  # still being written: what was read may be a part of it
            self._see(after)
            self._wait(trigger, "the file changed while it was read")
            return ReloadResult.WAITING
        self._loaded = before
        self._see(before)
        if isinstance(spec, FleetError):
            self._refuse(spec)
            result = ReloadResult.INVALID
        else:
            self.error = None
            if spec == self.spec:
                self.log.info("fleet-unchanged", trigger=trigger, generation=self.generation)
                result = ReloadResult.UNCHANGED
            else:
                self._apply(spec, trigger)
                result = ReloadResult.APPLIED
        self.results[result] += 1
        self.counted(result)
        return result

    def _refuse(self, e: FleetError) -> None:
        """Keep the fleet; log a new error once, remember it for the page."""
        message = str(e)
        if self.error is None or self.error.message != message:
            self.log.warn("fleet-invalid", problem=message, generation=self.generation)
        self.error = ReloadError(message, e.line, self.clock.seconds())

    def _apply(self, spec: FleetSpec, trigger: str = "start") -> None:
        """Switch to ``spec``: followers first, then the order (one reactor turn)."""
        self.spec = spec
        self.generation += 1
        self.loadedAt = self.clock.seconds()
        for engineId in spec.engines:
            backends = spec.serving(engineId)
            if engineId in self.serving:
                self.serving[engineId] = backends
                for follower in self.followers.get(engineId, ()):
                    follower.setBackends(backends)
            elif self.enableEngine(engineId, backends):
                self.serving[engineId] = backends
        for setClients in self.clientFollowers:
            setClients(spec.clients)
        kept = [e for e in self.serving if e not in spec.engines]
        if kept:
            # Closing a listener would cut its clients: such a facade stays until restart.
            self.log.warn("fleet-engine-kept", engines=kept)
        self.reorder([b.url for backends in self.serving.values() for b in backends])
        self.log.info(
            "fleet-loaded",
            generation=self.generation,
            trigger=trigger,
            engines=list(spec.engines),
            backends=sum(len(b) for b in self.serving.values()),
            clients=[c.name for c in spec.clients],
        )

    def names(self) -> dict[str, str]:
        """The backends' names by URL (node id), for the page and ``/status``."""
        if self.spec is None:
            return {}
        return {b.url: b.name for b in self.spec.backends if b.name is not None}


def findReloader(services: IServiceCollection) -> FleetReloader | None:
    """The process's fleet-file reloader, if it runs one (standalone with ``--fleet``)."""
    try:
        service = services.getServiceNamed(SERVICE_NAME)
    except KeyError:
        return None
    return service if isinstance(service, FleetReloader) else None


def reloadFrom(services: IServiceCollection) -> None:
    """SIGHUP's work: reload the fleet file, or say there is none."""
    reloader = findReloader(services)
    if reloader is None:
        FleetReloader.log.info("reload-ignored", reason="no fleet file (--fleet) is in use")
        return
    reloader.signalled()


SignalHandler = Callable[[int, FrameType | None], object]


def reloadOnSighup(
    reactor: IReactorCore,
    reload: Callable[[], None],
    setHandler: Callable[[int, SignalHandler], object] = signal.signal,
) -> None:
    """Make SIGHUP (``systemctl reload``) call ``reload`` on the reactor thread.

    The handler does nothing but queue the call through the signal-safe thread-call queue;
    it is installed once the reactor runs, beside the reactor's own handlers.
    """
    fromThreads = IReactorFromThreads(reactor)

    def onSighup(signum: int, frame: FrameType | None) -> None:
        fromThreads.callFromThread(reload)

    reactor.callWhenRunning(setHandler, signal.SIGHUP, onSighup)
