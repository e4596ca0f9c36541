"""Only a regular fleet file is read, never blocking (``facade.fleetread``, spec §11, issue
32): a named pipe, a directory or a device at the path is refused with a message saying
what it is, at start, by ``--check-fleet`` and on a reload."""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.fleetfile import MAX_FILE_BYTES, FleetError, loadFleet
from nvpair.proxy.facade.fleetread import NotRegularFile, readRegularFile
from nvpair.proxy.facade.reload import RELOAD_POLL, FleetReloader, ReloadResult
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.fleetconf.filekit import ONE, TWO, FleetFile


class ReadTests(SynchronousTestCase):
    """``readRegularFile`` and ``loadFleet`` on what a path may name."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nvpair-fleetread-")
        self.addCleanup(os.rmdir, self.dir)

    def path(self, name: str) -> str:
        path = os.path.join(self.dir, name)

        def remove() -> None:
            if os.path.lexists(path):
                os.remove(path)

        self.addCleanup(remove)
        return path

    def test_regular(self) -> None:
        """A regular file is read whole, at most ``limit`` bytes."""
        path = self.path("fleet.toml")
        with open(path, "w") as f:
            f.write(TWO)
        self.assertEqual(readRegularFile(path, 1 << 20), TWO.encode())
        self.assertEqual(readRegularFile(path, 10), TWO.encode()[:10])
        self.assertEqual(len(loadFleet(path).backends), 2)

    def test_notRegular(self) -> None:
        """A named pipe (with no writer: opening it would wait for one), a directory and a
        character device are refused at once, each named."""
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        for path, kind in (
            (fifo, "a named pipe"),
            (self.dir, "a directory"),
            ("/dev/null", "a character device"),
        ):
            with self.assertRaises(NotRegularFile) as caught:
                readRegularFile(path, MAX_FILE_BYTES)
            self.assertEqual(caught.exception.strerror, f"not a regular file ({kind})")
            with self.assertRaises(FleetError) as refused:
                loadFleet(path)
            self.assertEqual(
                str(refused.exception), f"{path}: cannot read: not a regular file ({kind})"
            )
            self.assertEqual(refused.exception.line, 0)

    def test_symlinkToRegular(self) -> None:
        """A symbolic link to a regular file is that file (``stat`` follows it)."""
        target = self.path("real.toml")
        with open(target, "w") as f:
            f.write(ONE)
        link = self.path("link.toml")
        os.symlink(target, link)
        self.assertEqual(len(loadFleet(link).backends), 1)


class ReloadPipeTests(SynchronousTestCase):
    """A reload of a path that became a named pipe."""

    def test_pipeRefused(self) -> None:
        """Refused without being opened: invalid, the fleet kept, the message saying what
        the path is."""
        context = FakeContext()
        file = FleetFile(self, ONE)
        counts: list[ReloadResult] = []
        reloader = FleetReloader(
            file.path, context.clock, lambda e, b: True, lambda o: None, counts.append
        )
        reloader.first(("llamacpp",))
        reloader.startService()
        self.addCleanup(reloader.stopService)
        os.remove(file.path)
        os.mkfifo(file.path)
        for _ in range(4):
            context.clock.advance(RELOAD_POLL)
        self.assertEqual((counts, reloader.generation), ([ReloadResult.INVALID], 1))
        assert reloader.error is not None
        self.assertEqual(
            reloader.error.message, f"{file.path}: cannot read: not a regular file (a named pipe)"
        )
