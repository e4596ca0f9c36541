"""The shapes of the operations listener's JSON documents: ``/status`` and ``/status/history``.

They are plain dicts at run time (``json.dumps`` writes them as they are); the
``TypedDict`` classes let the builders (``ops.server``, ``ops.history``) and the page
renderer (``ops.page``) agree on every key without reading the other's code.  The key
names are the documents' contract (``static/ops.js`` reads the same keys): never rename
one here alone.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class SeriesTotals(TypedDict):
    """One series summed over the whole window."""

    requests: int
    completed: int
    failed: int
    cancelled: int
    tokens: int
    ttftP50Ms: float | None
    errors: int
    errorsByReason: dict[str, int]


class Series(TypedDict):
    """One series (a facade's or a node's): a list per measure, one value per bucket."""

    requests: list[int]
    completed: list[int]
    failed: list[int]
    cancelled: list[int]
    requestsPerSecond: list[float]
    ttftP50Ms: list[float | None]
    tokens: list[int]
    tokensPerSecond: list[float]
    errors: list[int]
    errorsByReason: dict[str, list[int]]
    totals: SeriesTotals


class FacadeHistory(TypedDict):
    """A facade's own series and one per node it has served from."""

    series: Series
    nodes: dict[str, Series]


class HistoryDocument(TypedDict):
    """``/status/history``; ``reasons`` (error reasons in words) is added by the server."""

    bucketSeconds: int
    buckets: int
    start: int
    now: int
    ttftBoundsMs: list[int]
    facades: dict[str, FacadeHistory]
    reasons: NotRequired[dict[str, str]]


class NodeStatus(TypedDict):
    """One node of a facade's discovery snapshot, with this process's view of it."""

    id: str
    self: bool
    models: int
    modelNames: list[str]
    addresses: list[str]
    confirmed: str | None
    inFlight: int
    reserved: int
    estimatedLoad: float
    state: str
    stateReason: str
    checkedAt: int | None
    name: str | None
    engine: NotRequired[dict[str, object]]  # standalone: the engine's own state (§11.2)


class FacadeStatus(TypedDict):
    """One enabled facade; ``affinity`` only where a facade keeps its own counters."""

    port: int | None
    aliases: list[str]
    pin: str | None
    localBackend: str | None
    schedulerGeneration: int | None
    discoveryUpdates: int
    nodes: list[NodeStatus]
    affinity: NotRequired[dict[str, object]]


class SchedulerStatus(TypedDict):
    """The process-wide scheduler view the reservations were made against."""

    generation: int | None
    order: list[str]
    estimatedLoad: dict[str, float]


class WorkloadEntry(TypedDict):
    """One recently ended workload (no content): times in ms since the epoch."""

    id: object
    engine: object
    model: object
    state: object
    node: object
    attempts: object
    error: str | None
    stats: dict[str, object] | None
    createdAt: int | None
    completedAt: int | None
    durationMs: int | None
    errorText: str


class WorkloadsStatus(TypedDict):
    """Workload counts and the last ended ones, newest first."""

    live: int
    terminals: dict[str, int]
    recent: list[WorkloadEntry]


class FleetError(TypedDict):
    """The last refused fleet file: its one line, the line number, when (ms)."""

    message: str
    line: int
    at: int


class FleetBackend(TypedDict):
    """One ``[[backend]]`` of the fleet file in force."""

    engine: str
    url: str
    name: str | None
    maxConcurrency: int | None
    enabled: bool


class FleetClient(TypedDict):
    """One ``[[client]]`` of the fleet file in force: its name and weight (never its key)."""

    name: str
    weight: float


class FleetStatus(TypedDict):
    """The fleet file (standalone ``--fleet``): generation, load time, last refusal."""

    file: str
    generation: int
    loadedAt: int | None
    engines: list[str]
    keptEngines: list[str]
    backends: list[FleetBackend]
    clients: list[FleetClient]
    error: FleetError | None
    reloads: dict[str, int]


class StatusDocument(TypedDict):
    """``/status``: facades, discovery, the scheduler view and the last workloads."""

    runId: str
    now: int
    standalone: bool
    requestsInProgress: int
    facades: dict[str, FacadeStatus]
    scheduler: SchedulerStatus
    inFlight: dict[str, int]
    reservations: dict[str, int]
    affinity: dict[str, object]
    engineStates: NotRequired[dict[str, dict[str, object]]]
    residency: NotRequired[dict[str, object]]  # standalone: which models each node holds
    queueing: dict[str, object] | None
    workloads: WorkloadsStatus
    fleet: FleetStatus | None
