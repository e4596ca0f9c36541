"""The soak's knobs and records: the config, the engines' ledger of attempts, the client's sends."""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.define
class ChaosConfig:
    """The knobs of one soak run."""

    requests: int = 2000
    concurrency: int = 24
    engines: int = 5
    models: int = 10
    seed: int = 20240601
    responseTimeout: float = 1.0
    jobDeadline: float = 4.0
    maxAttempts: int = 5
    churnEvery: float = 0.3
    refuseFor: float = 0.15
    slowDelay: float = 0.05
    logLevel: str = "debug"
    clientTimeout: float = 60.0
    queue: bool = False  # standalone with the queue on: queue_full/queue_timeout may answer
    progress: Callable[[str], None] | None = None


@attrs.define
class Attempt:
    """One request an engine received for a chaos id.

    ``seq`` is the order the engines *read* the requests in, which is not the order the
    proxy sent them when the soak's process is starved of CPU: an attempt the proxy gave up
    on (header timeout, node left) may be read after the next one.  So each record also
    holds what the kernel saw: ``arrival``, when the request's bytes reached the engine's
    socket (None where unknown), ``read``, when the engine read it, and ``abandoned``,
    whether the proxy had already reset or closed the connection when it was read.
    """

    seq: int
    engine: str
    label: str
    arrival: float | None = None
    read: float | None = None
    abandoned: bool = False


class Ledger:
    """Every engine-side request of the soak, by chaos id, in the order the engines read them."""

    def __init__(self) -> None:
        self.seq = 0
        self.byId: dict[str, list[Attempt]] = {}

    def record(
        self,
        chaosId: str,
        engine: str,
        label: str,
        arrival: float | None = None,
        read: float | None = None,
        abandoned: bool = False,
    ) -> None:
        """Record one request as the engine reads it (before it answers)."""
        self.seq += 1
        attempt = Attempt(self.seq, engine, label, arrival, read, abandoned)
        self.byId.setdefault(chaosId, []).append(attempt)


@attrs.define
class Sent:
    """One client request of the soak and what it got."""

    chaosId: str
    kind: str  # "inference", "verbatim", "list"
    method: str
    path: str
    model: str | None
    stream: bool
    start: float
    end: float = 0.0
    status: int | None = None
    node: str | None = None
    attempts: int | None = None
    retryAfter: str | None = None
    body: bytes = b""
    truncated: bool = False
    error: str | None = None  # client-side failure other than truncation (a violation)
    answer: str = ""  # the judged answer class
    state: str | None = None  # expected terminal workload state
