"""Unit tests for nvpair.proxy.facade.reload and the pollers following a reloaded fleet."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.fleetfile import Backend, FleetSpec
from nvpair.proxy.facade.reload import (
    QUIET,
    RELOAD_POLL,
    FleetReloader,
    IFleetFollower,
    ReloadResult,
    UrlFollower,
    reloadFrom,
    reloadOnSighup,
)
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.fleetconf.filekit import BAD, ONE, TWO, FleetFile, RecordingFollower
from tests.support.fakes.logevents import Events
from tests.support.fakes.standalone import FakeService


class UrlFollowerTests(SynchronousTestCase):
    """``UrlFollower``: a follower of URLs only (an engine-state poller) on the same hook."""

    def test_urls(self) -> None:
        """It provides the interface and passes the URLs in order."""
        told: list[list[str]] = []
        follower = UrlFollower(lambda urls: told.append(list(urls)))
        verifyObject(IFleetFollower, follower)
        follower.setBackends(
            [Backend("ollama", "http://b:1", "B", 2), Backend("ollama", "http://a:1")]
        )
        self.assertEqual(told, [["http://b:1", "http://a:1"]])


class ReloaderTests(SynchronousTestCase):
    """Loading, refusing and switching the fleet, on a Clock."""

    def setUp(self) -> None:
        self.context = FakeContext()
        self.clock = self.context.clock
        self.events = Events()
        self.patch(FleetReloader, "log", Logger(observer=self.events))
        self.enabled: list[tuple[str, list[str]]] = []
        self.orders: list[list[str]] = []
        self.counts: list[ReloadResult] = []
        self.follower = RecordingFollower()

    def reloader(self, text: str, refuse: frozenset[str] = frozenset()) -> FleetReloader:
        self.file = FleetFile(self, text)

        def enable(engineId: str, backends: Sequence[Backend]) -> bool:
            self.enabled.append((engineId, [b.url for b in backends]))
            if engineId in refuse:
                return False
            reloader.follow(engineId, self.follower)
            return True

        reloader = FleetReloader(
            self.file.path,
            self.clock,
            enable,
            lambda o: self.orders.append(list(o)),
            self.counts.append,
        )
        reloader.first(("llamacpp",))
        reloader.startService()
        self.addCleanup(reloader.stopService)
        return reloader

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("log_format") == event]

    def test_follower(self) -> None:
        """The recording follower provides the interface others register with."""
        verifyObject(IFleetFollower, self.follower)

    def test_first(self) -> None:
        """At start the file's engines are enabled with their backends: generation 1."""
        self.clock.advance(100)
        reloader = self.reloader(TWO)
        self.assertEqual(self.enabled, [("llamacpp", ["http://a:1", "http://b:1"])])
        self.assertEqual(self.orders, [["http://a:1", "http://b:1"]])
        self.assertEqual((reloader.generation, reloader.loadedAt), (1, 100))
        self.assertEqual(reloader.names(), {"http://a:1": "alpha"})
        self.assertEqual(self.counts, [])  # the first load is not a reload

    def test_signalReload(self) -> None:
        """A reload applies a changed file: followers told, order changed, counted."""
        reloader = self.reloader(ONE)
        self.file.write(TWO)
        self.clock.advance(0.25)
        self.assertEqual(reloader.reload("signal"), ReloadResult.APPLIED)
        self.assertEqual(self.follower.sets, [["http://a:1", "http://b:1"]])
        self.assertEqual(self.orders[-1], ["http://a:1", "http://b:1"])
        self.assertEqual((reloader.generation, reloader.loadedAt), (2, 0.25))
        self.assertEqual(self.counts, [ReloadResult.APPLIED])
        self.assertEqual(len(self.enabled), 1)  # the facade was not enabled again
        self.assertEqual(self.named("fleet-loaded")[-1]["trigger"], "signal")

    def test_unchanged(self) -> None:
        """Reloading the same fleet changes nothing and says so."""
        reloader = self.reloader(ONE)
        self.assertEqual(reloader.reload("signal"), ReloadResult.UNCHANGED)
        self.assertEqual((self.follower.sets, reloader.generation), ([], 1))
        self.assertEqual(self.counts, [ReloadResult.UNCHANGED])

    def test_invalidKeepsFleet(self) -> None:
        """An invalid file changes nothing; its error is logged once, counted each time,
        and kept (with its line) until a valid file is loaded."""
        reloader = self.reloader(ONE)
        self.file.write(BAD)
        self.clock.advance(3)
        self.assertEqual(reloader.reload("signal"), ReloadResult.INVALID)
        self.assertEqual(reloader.reload("signal"), ReloadResult.INVALID)
        self.assertEqual((self.follower.sets, reloader.generation), ([], 1))
        self.assertEqual(self.counts, [ReloadResult.INVALID, ReloadResult.INVALID])
        assert reloader.error is not None
        self.assertEqual((reloader.error.line, reloader.error.at), (5, 3))
        self.assertTrue(reloader.error.message.startswith(f"{self.file.path}:5: invalid TOML"))
        self.assertEqual(len(self.named("fleet-invalid")), 1)
        self.file.write(ONE + 'engines = ["vllm"]\n')  # another error: logged too
        reloader.reload("signal")
        self.assertEqual(len(self.named("fleet-invalid")), 2)
        self.file.write(TWO)
        self.assertEqual(reloader.reload("signal"), ReloadResult.APPLIED)
        self.assertIsNone(reloader.error)

    def test_watchSettles(self) -> None:
        """A changed file is loaded once it held still for ``QUIET`` (not half-written)."""
        reloader = self.reloader(ONE)
        self.file.write(TWO[:-20])  # a writer part way through
        self.clock.advance(RELOAD_POLL)
        self.file.write(TWO)
        self.clock.advance(RELOAD_POLL)  # first seen whole now
        self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [])  # still within its quiet time
        self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.APPLIED])
        self.assertEqual(self.named("fleet-loaded")[-1]["trigger"], "file-changed")
        for _ in range(5):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.APPLIED])  # loaded once
        self.assertEqual(reloader.generation, 2)

    def test_slowWriterDropsNothing(self) -> None:
        """A writer that truncated the file, wrote a valid part (one backend of two) and
        paused for more than a poll before the rest: the part is never applied, so no
        backend is dropped; the whole file, the same fleet, reads as unchanged (issue 32)."""
        reloader = self.reloader(TWO)
        self.clock.advance(0.1)
        self.file.write(ONE)  # valid TOML, one backend
        self.clock.advance(0.9)
        self.clock.advance(RELOAD_POLL)  # the part held still for a whole poll
        self.clock.advance(0.5)
        self.file.write(TWO)
        for _ in range(5):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.follower.sets, [])
        self.assertEqual((self.counts, reloader.generation), ([ReloadResult.UNCHANGED], 1))

    def test_signalWaitsForQuiet(self) -> None:
        """SIGHUP on a file changed in the last ``QUIET`` seconds waits for it to be quiet,
        then reloads with trigger ``signal``; on a quiet file it reloads at once."""
        reloader = self.reloader(TWO)
        self.clock.advance(QUIET)
        reloader.signalled()
        self.assertEqual(self.counts, [ReloadResult.UNCHANGED])
        self.file.write(ONE)  # a writer part way through
        reloader.signalled()
        self.assertEqual(self.counts, [ReloadResult.UNCHANGED])
        self.assertEqual(self.named("fleet-reload-waiting")[-1]["trigger"], "signal")
        self.file.write(TWO)
        self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.UNCHANGED])
        for _ in range(3):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.UNCHANGED, ReloadResult.UNCHANGED])
        self.assertEqual(self.named("fleet-unchanged")[-1]["trigger"], "signal")
        self.assertEqual(self.follower.sets, [])

    def test_changedWhileRead(self) -> None:
        """A file that changes while it is read is not applied: the reload waits and reads
        it again once quiet (``waiting`` is not counted)."""
        reloader = self.reloader(ONE)
        load = reloader.load

        def writtenMeanwhile(path: str) -> FleetSpec:
            spec = load(path)
            self.file.write(TWO + "# more\n")
            return spec

        self.file.write(TWO)
        reloader.load = writtenMeanwhile
        self.assertEqual(reloader.reload("signal"), ReloadResult.WAITING)
        reloader.load = load
        self.assertEqual((self.follower.sets, self.counts), ([], []))
        for _ in range(3):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.APPLIED])
        self.assertEqual(self.named("fleet-loaded")[-1]["trigger"], "signal")
        self.assertEqual(self.follower.sets, [["http://a:1", "http://b:1"]])

    def test_watchInvalidOnce(self) -> None:
        """A file that stays invalid is read once, not on every poll."""
        self.reloader(ONE)
        self.file.write(BAD)
        for _ in range(10):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.INVALID])

    def test_removedFile(self) -> None:
        """A file that disappears is one refusal naming it; the fleet stays."""
        reloader = self.reloader(ONE)
        os.rename(self.file.path, self.file.path + ".gone")
        self.addCleanup(os.rename, self.file.path + ".gone", self.file.path)
        for _ in range(4):
            self.clock.advance(RELOAD_POLL)
        self.assertEqual(self.counts, [ReloadResult.INVALID])
        assert reloader.error is not None
        self.assertIn("cannot read", reloader.error.message)

    def test_newEngineEnabled(self) -> None:
        """An engine newly listed is enabled; one no longer listed is kept until restart."""
        reloader = self.reloader(ONE)
        self.file.write('[[backend]]\nengine = "ollama"\nurl = "http://o:1"\n')
        reloader.reload("signal")
        self.assertEqual(self.enabled[-1], ("ollama", ["http://o:1"]))
        self.assertEqual(list(reloader.serving), ["llamacpp", "ollama"])
        self.assertEqual(self.orders[-1], ["http://a:1", "http://o:1"])
        self.assertEqual(self.named("fleet-engine-kept")[-1]["engines"], ["llamacpp"])

    def test_bindFailureRetried(self) -> None:
        """A facade that could not bind is tried again by the next applied reload."""
        reloader = self.reloader(ONE, refuse=frozenset({"llamacpp"}))
        self.assertEqual(reloader.serving, {})
        self.file.write(TWO)
        reloader.reload("signal")
        self.assertEqual([e for e, _ in self.enabled], ["llamacpp", "llamacpp"])

    def test_turnedBadBeforeStart(self) -> None:
        """A file that turned bad between the options' check and the start: the facades
        run with no backend until a valid file comes."""
        reloader = self.reloader(BAD)
        self.assertEqual(self.enabled, [("llamacpp", [])])
        self.assertEqual(reloader.generation, 0)
        self.file.write(TWO)
        reloader.reload("signal")
        self.assertEqual(self.follower.sets, [["http://a:1", "http://b:1"]])


class SighupTests(SynchronousTestCase):
    """SIGHUP (``systemctl reload``) only schedules the reload on the reactor."""

    def test_handlerQueues(self) -> None:
        """Installed once the reactor runs; the handler queues the reload, nothing more."""
        running: list[Callable[..., object]] = []
        queued: list[Callable[[], object]] = []
        installed: dict[int, Any] = {}

        @implementer(IReactorFromThreads)
        class Reactor:
            def callWhenRunning(self, f: Callable[..., object], *args: object) -> None:
                running.append(lambda: f(*args))

            def callFromThread(
                self, callable: Callable[..., Any], *args: object, **kwargs: object
            ) -> None:
                queued.append(lambda: callable(*args, **kwargs))

        reloads: list[int] = []
        reloadOnSighup(
            Reactor(),  # type: ignore[arg-type]
            lambda: reloads.append(1),
            lambda signum, handler: installed.__setitem__(signum, handler),
        )
        self.assertEqual(installed, {})
        running[0]()
        installed[signal.SIGHUP](signal.SIGHUP, None)
        self.assertEqual(reloads, [])  # nothing ran inside the handler
        queued[0]()
        self.assertEqual(reloads, [1])

    def test_noFleetFile(self) -> None:
        """Without a fleet file SIGHUP is logged and ignored (it does not end the process)."""
        events = Events()
        self.patch(FleetReloader, "log", Logger(observer=events))
        reloadFrom(FakeService(("llamacpp",), ()))
        self.assertEqual([e["log_format"] for e in events], ["reload-ignored"])
