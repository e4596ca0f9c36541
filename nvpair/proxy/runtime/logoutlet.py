"""Log lines to stderr without ever stalling the reactor.

stderr is a pipe the broker reads.  Should the broker stop reading it, a plain ``write``
would block the reactor thread as soon as the pipe is full, and every request with it.
``LineOutlet`` is the log observer's stream: ``write`` only queues the line (a few hundred
nanoseconds, under a lock) and a writer thread hands queued lines to the real stream in
batches.  At most ``limit`` bytes wait; a line that does not fit is dropped and counted,
and once the writer gets going again it adds one ``log-lines-dropped`` record with the
count.  ``close`` gives the writer a bounded time to finish (process exit).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import IO

DEFAULT_LIMIT = 1 << 20  # bytes of lines waiting for the writer
CLOSE_WAIT = 2.0  # seconds ``close`` waits for the writer (the exit deadline is 5 s)

Starter = Callable[[Callable[[], None]], None]


class OutletState(Enum):
    """Whether the outlet takes lines: open, closing (the process exits), or broken (the
    stream failed; nothing more can be logged)."""

    OPEN = "open"
    CLOSING = "closing"
    BROKEN = "broken"


def _daemonThread(run: Callable[[], None]) -> None:
    threading.Thread(target=run, name="nvpair-log-writer", daemon=True).start()


class LineOutlet:
    """A text stream whose writes queue for a writer thread, bounded in bytes."""

    def __init__(
        self,
        stream: IO[str],
        component: str,
        limit: int = DEFAULT_LIMIT,
        start: Starter = _daemonThread,
        clock: Callable[[], float] = time.time,
        render: Callable[[dict[str, object]], str] = json.dumps,
    ) -> None:
        self._stream = stream
        self._component = component
        self._limit = limit
        self._clock = clock
        self._render = render  # the format of the dropped-lines record (JSON or text)
        self._ready = threading.Condition()
        self._lines: list[str] = []
        self._bytes = 0
        self._dropped = 0
        self._state = OutletState.OPEN
        self._done = threading.Event()
        start(self._run)

    # -- the reactor's side (any thread) ----------------------------------------------------

    def write(self, text: str) -> None:
        """Queue ``text`` for the writer; drop it (counted) if the queue is full."""
        with self._ready:
            if self._state is not OutletState.OPEN:
                return
            if self._bytes + len(text) > self._limit:
                self._dropped += 1
                return
            self._lines.append(text)
            self._bytes += len(text)
            self._ready.notify()

    def flush(self) -> None:
        """Nothing to do here: the writer flushes after every batch."""

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Let the writer finish what is queued, waiting at most ``wait`` seconds for it."""
        with self._ready:
            if self._state is OutletState.OPEN:
                self._state = OutletState.CLOSING
            self._ready.notify()
        self._done.wait(wait)

    # -- the writer's side ----------------------------------------------------------------

    def drain(self, block: bool = True) -> bool:
        """Write everything queued (after waiting for something, when ``block``) plus the
        dropped-lines record if lines were dropped; False once closed and empty or broken."""
        with self._ready:
            while (
                block and not self._lines and not self._dropped and self._state is OutletState.OPEN
            ):
                self._ready.wait()
            lines, self._lines, self._bytes = self._lines, [], 0
            dropped, self._dropped = self._dropped, 0
            state = self._state
        if state is OutletState.BROKEN or (
            state is OutletState.CLOSING and not lines and not dropped
        ):
            return False
        if dropped:
            lines.append(self._droppedRecord(dropped))
        if lines:
            try:
                self._stream.write("".join(lines))
                self._stream.flush()
            except (OSError, ValueError):
                # stderr closed or broken: nothing more can be logged; stop queueing.
                with self._ready:
                    self._state = OutletState.BROKEN
                    self._lines, self._bytes = [], 0
                return False
        return True

    def _run(self) -> None:
        try:
            while self.drain():
                pass
        finally:
            self._done.set()

    def _droppedRecord(self, count: int) -> str:
        record: dict[str, object] = {
            "time": self._clock(),
            "level": "warn",
            "component": self._component,
            "event": "log-lines-dropped",
            "count": count,
        }
        return self._render(record) + "\n"
