"""The process's reactor: Twisted's epoll reactor with a leaner event dispatch.

Twisted's ``doPoll`` wraps every ready descriptor's callback in the legacy logging context
(four Python frames and two dict copies per event) so that ``twisted.python.log`` messages
carry the connection's ``system`` prefix.  The proxy's log records never show that prefix
(``runtime.logs`` drops it), so ``ProxyReactor`` hands plain read events straight to the
descriptor and everything else to Twisted's own ``_doReadOrWrite``.  Errors are handled
the same way: logged, and the descriptor disconnected.

This is the one module of the proxy that uses Twisted private names (the epoll reactor's
``_poller``, ``_selectables``, ``_doReadOrWrite`` and ``_disconnectSelectable``), kept
because it measured 6-14 % less proxy CPU per request (and per stream) than the stock
reactor (A/B in ``bench/RESULTS.md``, "Reactor internals: A/B"; ``python -m
bench.reactorab``).  ``tests/runtime/test_eventloop.py`` pins what is relied on against the
installed Twisted.

It is a reactor plugin named ``nvpair`` (``twisted/plugins/nvpair_reactors.py``, listed by
``twistd --help-reactors``): ``twistd --reactor=nvpair`` (or ``-r nvpair``) calls ``install``,
and the ``nvpair-proxy`` command passes that option; ``twistd -n nvpair-proxy`` without it
runs Twisted's default reactor (epoll on Linux), and nothing in the service maker installs
one.  ``install`` keeps a reactor that is installed already.  Should a Twisted release
rename the epoll reactor's parts it relies on, the stock epoll reactor is installed instead.

It also ends each turn with the calls asked for during it (``ITurnEnd``): after a poll's
events have run, and before the next wait (so that what timers asked for is done too).  The
broker channel uses it to write a turn's notifications to stdout at once: one transport
write per turn instead of one per notification (each costs Twisted a dozen calls on the
pipe writer).  A reactor without it (the stock one) gets each line written at once.
"""

from __future__ import annotations

import errno
import select
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from twisted.internet.epollreactor import EPollReactor
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.posixbase import PosixReactorBase
from twisted.python import log
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

_READ = select.EPOLLIN

# The epoll reactor's own parts ``ProxyReactor.doPoll`` uses.
_RELIED_ON = ("_poller", "_selectables", "_doReadOrWrite", "_disconnectSelectable")

# A registered descriptor.  Only one polled for reading gets a plain read event, so the
# direct path may call ``doRead``; any other event goes to the reactor's own handling.
Selectable = IReadDescriptor
Handler = Callable[[Selectable, int, int], None]
Disconnect = Callable[[Selectable, Failure | BaseException, bool], None]


def dispatchEvents(
    events: Iterable[tuple[int, int]],
    selectables: Mapping[int, Selectable],
    handle: Handler,
    disconnect: Disconnect,
) -> None:
    """Run one poll's ready events: a plain read calls ``doRead`` directly, any other event
    mask goes to ``handle`` (Twisted's full read/write/hang-up logic).  A descriptor
    removed by an earlier event of the same poll is skipped."""
    for fd, event in events:
        selectable = selectables.get(fd)
        if selectable is None:
            continue
        if event != _READ:
            handle(selectable, fd, event)
            continue
        why: Failure | BaseException | None
        try:
            why = selectable.doRead()
        except BaseException as e:
            why = e
            log.err()
        if why:
            disconnect(selectable, why, True)


class ITurnEnd(Interface):
    """A reactor that runs calls at the end of its current turn."""

    def callAtTurnEnd(f: Callable[[], object]) -> None:
        """Call ``f`` once, after the events of the current turn have run and before the
        reactor waits again (called from a timer, before the next wait)."""


def endTurn(calls: list[Callable[[], object]]) -> None:
    """Run and empty ``calls`` (those asked for while they run included), each on its own:
    one that raises is logged, and the rest still run."""
    ran = 0
    while ran < len(calls):
        f = calls[ran]
        ran += 1
        try:
            f()
        except BaseException:
            log.err()
    calls.clear()


@implementer(ITurnEnd)
class ProxyReactor(EPollReactor):
    """An epoll reactor whose event dispatch skips the legacy per-event log context, and
    whose turns end with the calls asked for during them."""

    def __init__(self) -> None:
        self.atTurnEnd: list[Callable[[], object]] = []
        super().__init__()

    def callAtTurnEnd(self, f: Callable[[], object]) -> None:
        self.atTurnEnd.append(f)

    def doPoll(self, timeout: float | None) -> None:
        """Finish what the timers asked for, wait for ready descriptors (at most ``timeout``
        seconds), run their events, and end the turn."""
        if self.atTurnEnd:
            endTurn(self.atTurnEnd)
        try:
            events = self._poller.poll(-1 if timeout is None else timeout, len(self._selectables))
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
        dispatchEvents(events, self._selectables, self._doReadOrWrite, self._disconnectSelectable)
        if self.atTurnEnd:
            endTurn(self.atTurnEnd)

    doIteration = doPoll


def install() -> PosixReactorBase:
    """Install ``ProxyReactor`` unless a reactor is installed already; return the reactor.

    Every reactor Twisted installs on Linux (epoll, poll, select, asyncio) is a
    ``PosixReactorBase``: that is the type the process uses it as (TCP, time, processes).
    """
    if "twisted.internet.reactor" not in sys.modules:
        from twisted.internet.main import installReactor

        chosen: EPollReactor = ProxyReactor()
        if not all(hasattr(chosen, name) for name in _RELIED_ON):
            chosen = EPollReactor()  # a Twisted release renamed them: the stock dispatch
        installReactor(chosen)
    from twisted.internet import reactor

    return cast(PosixReactorBase, reactor)
