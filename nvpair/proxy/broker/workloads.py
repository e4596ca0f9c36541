"""Workload lifecycle events (spec §5.5, protocol §5).

Every inference request is a workload from admission to its single terminal event.  The
reporter numbers workloads and events process-wide; a ``Workload`` guarantees that exactly
one terminal event is emitted, whatever path ends the request.

Each event's params are an ``_Event``: the ``{"workloadInfo": info}`` dict every sink sees,
which the broker channel writes from a template (the fields fixed for the workload's life
are escaped once, and each event holds its own copy of that text) instead of walking it
with the general JSON encoder.  The bytes are the
encoder's own, to the byte (``tests/broker/test_notify_golden.py``).
"""

from __future__ import annotations

import os
from collections import deque
from json.encoder import encode_basestring

from twisted.internet.interfaces import IReactorTime
from zope.interface import Interface, implementer

from nvpair.proxy.broker.jsonrpc import Prepared, encodeValue
from nvpair.proxy.interfaces import IBrokerSink, IWorkload, IWorkloadReporter

QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"

_STATES = {state: f'"{state}"' for state in (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED)}

KEPT_CHARS = 256
"""The most characters of a string kept in a recent workload (spec §13): a longer one is cut
there with :func:`keptCopy`'s marker, so the kept records stay small whatever a client named."""


def keptCopy(text: str, limit: int = KEPT_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit`` followed by
    a marker saying how many were cut (``…[+N chars]``)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[+{len(text) - limit} chars]"


def _kept(text: str | None) -> str | None:
    return text if text is None or len(text) <= KEPT_CHARS else keptCopy(text)


def _string(value: object) -> str:
    """A string as the encoder writes it (``ensure_ascii=False`` escaping); any other value
    (never the case for a well-typed caller) through the encoder itself."""
    return encode_basestring(value) if type(value) is str else encodeValue(value)


class IWorkloadEnds(Interface):
    """Where each workload's end is counted besides its event (the operations history)."""

    def ended(
        engine: str,
        node: str | None,
        served: bool,
        state: str,
        error: str | None,
        stats: dict[str, object] | None,
    ) -> None:
        """One workload ended in ``state``; ``served`` if a node started answering it."""


@implementer(IWorkloadReporter)
class WorkloadReporter:
    """Numbers workloads and events, keeps the last ones, and tells ``ends`` (if given)
    of every workload's end."""

    def __init__(
        self,
        sink: IBrokerSink,
        clock: IReactorTime,
        runId: str | None = None,
        recent: int = 50,
        ends: IWorkloadEnds | None = None,
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.runId = runId or os.urandom(8).hex()
        self._nextId = 0
        self.seq = 0
        self.recent: deque[dict[str, object]] = deque(maxlen=recent)
        self.terminals: dict[str, int] = {}
        self.live = 0
        self.ends = ends

    def admit(self, engine: str, model: str) -> Workload:
        """Create a workload at admission and emit its first ``submitted`` (queued, unplaced)."""
        self._nextId += 1
        workload = Workload(self, str(self._nextId), engine, model, self.clock.seconds())
        self.live += 1
        workload.submitted(None)
        return workload


class _Event(Prepared):
    """The params ``{"workloadInfo": info}`` of one workload event, written from a template.

    ``info`` is built by :meth:`Workload._emit` and never changed after: its keys are in
    :meth:`Workload.info`'s order then ``seq``; ``id``, ``model``, ``engine``, ``runId`` and
    ``createdAt`` are the workload's own, fixed for its life (written once, in its
    ``_head``/``_mid``, which the event holds: a finished workload lets go of them);
    ``originatedFrom`` is ``""`` and ``requesterId`` ``None``.
    """

    __slots__ = ("_head", "_mid", "_info", "_state")

    _head: str
    _mid: str
    _info: dict[str, object]  # ``self["workloadInfo"]``, typed
    _state: str  # its ``state``

    def paramsJSON(self) -> str:
        info, state = self._info, self._state
        error = info["error"]
        text = (
            f"{self._head}{_STATES.get(state) or _string(state)}{self._mid}"
            f'{"null" if error is None else _string(error)},"requesterId":null'
        )
        if len(info) > 10:  # anything past the nine fixed keys and ``seq``
            if "scheduledOn" in info:
                text += ',"scheduledOn":' + _string(info["scheduledOn"])
            if "startedAt" in info:
                text += f',"startedAt":{info["startedAt"]}'
            if "completedAt" in info:
                text += f',"completedAt":{info["completedAt"]}'
            if "stats" in info:
                text += ',"stats":' + encodeValue(info["stats"])
        return f'{text},"seq":{info["seq"]}}}}}'


@implementer(IWorkload)
class Workload:
    """One inference request's lifecycle; terminal exactly once."""

    __slots__ = (
        "_reporter",
        "id",
        "engine",
        "model",
        "createdAt",
        "startedAt",
        "completedAt",
        "state",
        "scheduledOn",
        "attempts",
        "error",
        "stats",
        "_head",
        "_mid",
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
        self.stats: dict[str, object] | None = None
        # The JSON of the fields before and after ``state`` that never change: written the
        # first time an event is sent (with nobody listening, never).
        self._head = ""
        self._mid = ""

    @property
    def ended(self) -> bool:
        """Whether the terminal event has been emitted."""
        return self.completedAt is not None

    def info(self) -> dict[str, object]:
        """The ``workloadInfo`` object as it stands now (protocol §5)."""
        info: dict[str, object] = {
            "id": self.id,
            "model": self.model,
            "engine": self.engine,
            "runId": self._reporter.runId,
            "state": self.state,
            "originatedFrom": "",
            "createdAt": int(self.createdAt * 1000),
            "error": self.error,
            "requesterId": None,
        }
        if self.scheduledOn is not None:
            info["scheduledOn"] = self.scheduledOn
        if self.startedAt is not None:
            info["startedAt"] = int(self.startedAt * 1000)
        if self.completedAt is not None:
            info["completedAt"] = int(self.completedAt * 1000)
        if self.stats is not None:
            info["stats"] = self.stats
        return info

    def _writeHead(self) -> str:
        """Write the JSON of the fixed fields once: up to ``"state":`` and from
        ``originatedFrom`` to ``"error":``."""
        self._head = head = (
            f'{{"workloadInfo":{{"id":{_string(self.id)},"model":{_string(self.model)},'
            f'"engine":{_string(self.engine)},"runId":{_string(self._reporter.runId)},"state":'
        )
        self._mid = f',"originatedFrom":"","createdAt":{int(self.createdAt * 1000)},"error":'
        return head

    def _emit(self, method: str) -> None:
        """Send one event: ``info()`` stamped with the next ``seq``."""
        reporter = self._reporter
        if not reporter.sink.listening:
            reporter.seq += 1  # nobody receives events (standalone): count, build nothing
            return
        info = self.info()
        reporter.seq = info["seq"] = reporter.seq + 1
        params = _Event()
        params["workloadInfo"] = params._info = info
        params._state = self.state
        params._head = self._head or self._writeHead()
        params._mid = self._mid
        reporter.sink.notify(method, params)

    def submitted(self, scheduledOn: str | None) -> None:
        """Queued: placed on ``scheduledOn`` (a dispatch), or unplaced (admission, retry)."""
        if self.completedAt is not None or self.state != QUEUED:
            return
        if scheduledOn is not None:
            self.attempts += 1
        self.scheduledOn = scheduledOn
        self._emit("workload:submitted")

    def started(self, nodeId: str) -> None:
        """The engine began producing content on ``nodeId`` (commit)."""
        if self.completedAt is not None or self.state != QUEUED:
            return
        self.state = RUNNING
        self.scheduledOn = nodeId
        self.startedAt = self._reporter.clock.seconds()
        self._emit("workload:started")

    def finish(
        self, state: str, error: str | None = None, stats: dict[str, object] | None = None
    ) -> bool:
        """Emit the terminal event once; later calls do nothing and return False."""
        if self.completedAt is not None:
            return False
        reporter = self._reporter
        self.state = state
        self.error = error
        self.stats = stats
        self.completedAt = reporter.clock.seconds()
        self._emit("workload:completed" if state == COMPLETED else "workload:errored")
        reporter.live -= 1
        reporter.terminals[state] = reporter.terminals.get(state, 0) + 1
        model = keptCopy(self.model)
        reporter.recent.append(
            {
                "id": self.id,
                "engine": self.engine,
                "model": model,
                "state": state,
                "node": _kept(self.scheduledOn),
                "attempts": self.attempts,
                "error": _kept(error),
                "stats": stats,
                "createdAt": self.createdAt,
                "completedAt": self.completedAt,
            }
        )
        if reporter.ends is not None:
            reporter.ends.ended(
                self.engine, self.scheduledOn, self.startedAt is not None, state, error, stats
            )
        # Its last event is out: from now on it keeps only a bounded copy of its model.
        self.model, self._head, self._mid = model, "", ""
        return True
