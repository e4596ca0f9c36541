"""Unit tests of the log's stream (``logoutlet``): bounded, never blocking its writers.

The writer thread is not started: the tests run its ``drain`` steps themselves.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.runtime.logoutlet import LineOutlet


class Recording(io.StringIO):
    """A stream recording each write and flush."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1


class Broken(io.StringIO):
    """stderr closed under us."""

    def write(self, text: str) -> int:
        raise BrokenPipeError()


class OutletCase(SynchronousTestCase):
    def outlet(self, stream: io.StringIO, limit: int = 1000) -> LineOutlet:
        self.runs: list[Callable[[], None]] = []
        return LineOutlet(
            stream, "nvpair-proxy", limit, start=self.runs.append, clock=lambda: 1234.5
        )


class OutletTests(OutletCase):
    """Lines queue without touching the stream and leave in order, in batches."""

    def test_writeOnlyQueues(self) -> None:
        """A write never reaches the stream by itself: it waits for the writer."""
        stream = Recording()
        outlet = self.outlet(stream)
        outlet.write("a\n")
        outlet.flush()
        self.assertEqual(stream.writes, [])
        self.assertEqual(len(self.runs), 1, "one writer started")

    def test_batchInOrder(self) -> None:
        """Queued lines are written in order as one write, then flushed."""
        stream = Recording()
        outlet = self.outlet(stream)
        for line in ("a\n", "b\n", "c\n"):
            outlet.write(line)
        self.assertTrue(outlet.drain(block=False))
        self.assertEqual(stream.writes, ["a\nb\nc\n"])
        self.assertEqual(stream.flushes, 1)

    def test_overLimitDroppedAndCounted(self) -> None:
        """Past the limit lines are dropped; the next batch ends with one record saying how
        many, and lines fit again afterwards."""
        stream = Recording()
        outlet = self.outlet(stream, limit=10)
        for _ in range(7):
            outlet.write("abcd\n")  # two fit in 10 bytes
        outlet.drain(block=False)
        lines = stream.getvalue().splitlines()
        self.assertEqual(lines[:2], ["abcd", "abcd"])
        record = json.loads(lines[2])
        self.assertEqual(
            record,
            {
                "time": 1234.5,
                "level": "warn",
                "component": "nvpair-proxy",
                "event": "log-lines-dropped",
                "count": 5,
            },
        )
        self.assertEqual(len(lines), 3)
        outlet.write("later\n")
        outlet.drain(block=False)
        self.assertEqual(stream.getvalue().splitlines()[-1], "later")

    def test_queueBounded(self) -> None:
        """However many lines arrive while nothing drains, at most the limit is held."""
        stream = Recording()
        outlet = self.outlet(stream, limit=100)
        for _ in range(100000):
            outlet.write("0123456789\n")
        outlet.drain(block=False)
        lines = stream.getvalue().splitlines()
        self.assertEqual(len(lines), 9 + 1)
        self.assertEqual(json.loads(lines[-1])["count"], 100000 - 9)

    def test_closeWritesTheRestThenEnds(self) -> None:
        """After ``close`` the writer writes what is queued, then stops."""
        stream = Recording()
        outlet = self.outlet(stream)
        outlet.write("last\n")
        outlet.close(wait=0)
        self.assertTrue(outlet.drain())
        self.assertEqual(stream.getvalue(), "last\n")
        self.assertFalse(outlet.drain(), "closed and empty: the writer ends")
        outlet.write("after\n")
        self.assertFalse(outlet.drain())
        self.assertEqual(stream.getvalue(), "last\n")

    def test_brokenStreamStopsQuietly(self) -> None:
        """A stream that can no longer be written ends the writer; later writes are
        dropped without an exception in the caller."""
        outlet = self.outlet(Broken())
        outlet.write("x\n")
        self.assertFalse(outlet.drain(block=False))
        outlet.write("y\n")
        self.assertFalse(outlet.drain(block=False))

    def test_writerLoopEndsOnClose(self) -> None:
        """The writer's loop (what the thread runs) returns once closed and drained, and
        ``close`` then returns without waiting."""
        stream = Recording()
        outlet = self.outlet(stream)
        outlet.write("a\n")
        outlet.close(wait=0)
        self.runs[0]()
        self.assertEqual(stream.getvalue(), "a\n")
        outlet.close(wait=60)  # the loop has ended: nothing to wait for


class ThreadTests(SynchronousTestCase):
    """With its real thread, lines reach the stream and ``close`` waits for them."""

    def test_realWriterThread(self) -> None:
        stream = Recording()
        outlet = LineOutlet(stream, "nvpair-proxy")
        for i in range(100):
            outlet.write(f"{i}\n")
        outlet.close(wait=30)
        self.assertEqual(stream.getvalue().splitlines(), [str(i) for i in range(100)])
