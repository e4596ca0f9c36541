"""Workload lifecycle events (spec §5.5, protocol §5).

Every inference request is a workload from admission to its single terminal event.  The
reporter numbers workloads and events process-wide; a ``Workload`` guarantees that exactly
one terminal event is emitted, whatever path ends the request.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy._interfaces import IBrokerSink

QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class WorkloadReporter:
    """Numbers workloads and events, and keeps a short history for the status page."""

    def __init__(
        self, sink: IBrokerSink, clock: IReactorTime, runId: str | None = None, history: int = 50
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.runId = runId or os.urandom(8).hex()
        self._nextId = 0
        self.seq = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=history)
        self.terminals: dict[str, int] = {}
        self.live = 0

    def admit(self, engine: str, model: str) -> Workload:
        """Create a workload at admission and emit its first ``submitted`` (queued, unplaced)."""
        self._nextId += 1
        workload = Workload(self, str(self._nextId), engine, model, self.clock.seconds())
        self.live += 1
        workload.submitted(None)
        return workload

    def emit(self, method: str, info: dict[str, Any]) -> None:
        """Stamp ``seq`` and send one workload event."""
        self.seq += 1
        info["seq"] = self.seq
        self.sink.notify(method, {"workloadInfo": info})


class Workload:
    """One inference request's lifecycle; terminal exactly once."""

    __slots__ = (
        "_reporter", "id", "engine", "model", "createdAt", "startedAt", "completedAt",
        "state", "scheduledOn", "attempts", "error", "stats",
    )

    def __init__(
        self, reporter: WorkloadReporter, id: str, engine: str, model: str, createdAt: float
    ) -> None:
        self._reporter = reporter
        self.id = id
        self.engine = engine
        self.model = model
        self.createdAt = createdAt
        self.startedAt: float | None = None
        self.completedAt: float | None = None
        self.state = QUEUED
        self.scheduledOn: str | None = None
        self.attempts = 0
        self.error: str | None = None
        self.stats: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Whether the terminal event has been emitted."""
        return self.completedAt is not None

    def info(self) -> dict[str, Any]:
        """The ``workloadInfo`` object as it stands now (protocol §5)."""
        info: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "engine": self.engine,
            "runId": self._reporter.runId,
            "state": self.state,
            "originatedFrom": "",
            "createdAt": _ms(self.createdAt),
            "error": self.error,
            "requesterId": None,
        }
        if self.scheduledOn is not None:
            info["scheduledOn"] = self.scheduledOn
        if self.startedAt is not None:
            info["startedAt"] = _ms(self.startedAt)
        if self.completedAt is not None:
            info["completedAt"] = _ms(self.completedAt)
        if self.stats is not None:
            info["stats"] = self.stats
        return info

    def submitted(self, scheduledOn: str | None) -> None:
        """Queued: placed on ``scheduledOn`` (a dispatch), or unplaced (admission, retry)."""
        if self.ended or self.state != QUEUED:
            return
        if scheduledOn is not None:
            self.attempts += 1
        self.scheduledOn = scheduledOn
        self._reporter.emit("workload:submitted", self.info())

    def started(self, nodeId: str) -> None:
        """The engine began producing content on ``nodeId`` (commit)."""
        if self.ended or self.state != QUEUED:
            return
        self.state = RUNNING
        self.scheduledOn = nodeId
        self.startedAt = self._reporter.clock.seconds()
        self._reporter.emit("workload:started", self.info())

    def finish(
        self, state: str, error: str | None = None, stats: dict[str, Any] | None = None
    ) -> bool:
        """Emit the terminal event once; later calls do nothing and return False."""
        if self.ended:
            return False
        reporter = self._reporter
        self.state = state
        self.error = error
        self.stats = stats
        self.completedAt = reporter.clock.seconds()
        method = "workload:completed" if state == COMPLETED else "workload:errored"
        info = self.info()
        reporter.emit(method, info)
        reporter.live -= 1
        reporter.terminals[state] = reporter.terminals.get(state, 0) + 1
        reporter.recent.append(
            {
                "id": self.id,
                "engine": self.engine,
                "model": self.model,
                "state": state,
                "node": self.scheduledOn,
                "attempts": self.attempts,
                "error": error,
                "stats": stats,
            }
        )
        return True
