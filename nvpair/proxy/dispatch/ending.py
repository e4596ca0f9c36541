"""How an exchange's request ends for its workload (spec §8): completed, failed or cancelled,
from how its answer went (the exchange calls these once, at its one ending); and how its
placement policy pauses between rounds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from twisted.internet import task
from twisted.internet.defer import Deferred, race
from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.broker.workloads import CANCELLED, COMPLETED, FAILED
from nvpair.proxy.dispatch.interfaces import IFacadeView
from nvpair.proxy.dispatch.outcome import CLIENT_GONE
from nvpair.proxy.endings import BodyEnding

if TYPE_CHECKING:
    from nvpair.proxy.interfaces import IWorkload
    from nvpair.proxy.routing.stats import StatsMeter


class Unserved(Protocol):
    """What ``finishUnserved`` reads of an exchange that ends with no terminal event yet."""

    @property
    def clientGone(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def committedStatus(self) -> int | None: ...
    @property
    def expectedLength(self) -> int | None: ...
    @property
    def written(self) -> int: ...
    @property
    def meter(self) -> StatsMeter | None: ...


def finishUnserved(workload: IWorkload, ex: Unserved, now: float) -> None:
    """The request ended with no terminal event yet: completed when the client hung up
    after its whole answer (``answerDelivered``: the openai client stops at ``data:
    [DONE]``, before the engine closes the body), else cancelled (the client gone, or the
    process stopping) or failed."""
    gone, stopping, meter = ex.clientGone, ex.stopping, ex.meter
    if (
        gone
        and not stopping
        and answerDelivered(ex.committedStatus, ex.expectedLength, ex.written, meter)
    ):
        workload.finish(COMPLETED, None, None if meter is None else meter.result(now))
    elif gone or stopping:
        workload.finish(CANCELLED, "cancelled")
    else:
        workload.finish(FAILED, "internal")


def answerDelivered(
    status: int | None, expectedLength: int | None, written: int, meter: StatsMeter | None
) -> bool:
    """Whether a committed 2xx answer was passed on whole: all of its Content-Length, or a
    stream whose last event is the dialect's end-of-answer marker."""
    if status is None or not 200 <= status < 300:
        return False
    if expectedLength is not None:
        return written >= expectedLength
    return meter is not None and meter.sawEnd()


def finishServed(
    workload: IWorkload,
    ending: BodyEnding,
    clientGone: bool,
    status: int,
    meter: StatsMeter | None,
    now: float,
) -> None:
    """The committed body ended as ``ending`` says: the workload's terminal event."""
    if ending is CLIENT_GONE or clientGone:
        workload.finish(CANCELLED, "client disconnected")
        return
    stats = None if meter is None else meter.result(now)
    if 200 <= status < 300:
        workload.finish(COMPLETED, None, stats)
    else:
        workload.finish(FAILED, f"upstream status {status}", stats)


def pauseFor(
    clock: IReactorTime, facade: IFacadeView, seconds: float, wakeOnDiscovery: bool
) -> Deferred[None]:
    """A policy's pause: ``seconds`` (or until discovery changes, when asked), cancellably."""
    sleep = task.deferLater(clock, max(seconds, 0.0), _nothing)
    if not wakeOnDiscovery:
        return sleep
    return race([sleep, facade.nextSnapshot()]).addCallback(_nothing)


def _nothing(_: object = None) -> None:
    return None
