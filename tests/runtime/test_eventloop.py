"""Unit tests of the process reactor's event dispatch (``eventloop``)."""

from __future__ import annotations

import errno
import os
import select
import subprocess
import sys
from collections.abc import Callable

from twisted.internet.epollreactor import EPollReactor
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IReadDescriptor
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.runtime import eventloop
from nvpair.proxy.runtime.eventloop import ITurnEnd, ProxyReactor, dispatchEvents

IN, OUT, HUP = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP


# Why a read ended the connection.  Twisted's own readers answer an exception instance
# (``main.CONNECTION_DONE``) though ``IReadDescriptor.doRead`` is annotated ``Failure | None``,
# hence the ``override`` ignores below.
Reason = Failure | BaseException


@implementer(IReadDescriptor)
class Descriptor:
    """A ready descriptor recording its reads; ``why`` is what ``doRead`` answers."""

    def __init__(self, why: Reason | None = None, error: BaseException | None = None) -> None:
        self.why = why
        self.error = error
        self.reads = 0
        self.onRead: Callable[[], object] | None = None

    def fileno(self) -> int:
        return -1

    def logPrefix(self) -> str:
        return "descriptor"

    def doRead(self) -> Reason | None:  # type: ignore[override]
        self.reads += 1
        if self.onRead is not None:
            self.onRead()
        if self.error is not None:
            raise self.error
        return self.why

    def connectionLost(self, reason: Failure) -> None:
        raise AssertionError("dispatchEvents never disconnects by itself")


class Recorder:
    """Records what the full handler and the disconnect step are asked to do."""

    def __init__(self) -> None:
        self.handled: list[tuple[IReadDescriptor, int, int]] = []
        self.disconnected: list[tuple[IReadDescriptor, Reason, bool]] = []

    def handle(self, selectable: IReadDescriptor, fd: int, event: int) -> None:
        self.handled.append((selectable, fd, event))

    def disconnect(self, selectable: IReadDescriptor, why: Reason, inRead: bool) -> None:
        self.disconnected.append((selectable, why, inRead))


class DispatchTests(SynchronousTestCase):
    """Plain reads go straight to the descriptor; every other event to the full handler."""

    def test_descriptorsAreReadDescriptors(self) -> None:
        """The stand-ins provide what the reactor registers: ``IReadDescriptor``."""
        self.assertTrue(verifyObject(IReadDescriptor, Descriptor()))
        self.assertTrue(verifyObject(IReadDescriptor, PipeReader(-1)))

    def dispatch(
        self, events: list[tuple[int, int]], selectables: dict[int, Descriptor]
    ) -> Recorder:
        recorder = Recorder()
        dispatchEvents(events, selectables, recorder.handle, recorder.disconnect)
        return recorder

    def test_plainReadCallsDoRead(self) -> None:
        """A read event reads the descriptor and nothing else happens."""
        d = Descriptor()
        recorder = self.dispatch([(5, IN)], {5: d})
        self.assertEqual(d.reads, 1)
        self.assertEqual(recorder.handled, [])
        self.assertEqual(recorder.disconnected, [])

    def test_otherMasksGoToHandler(self) -> None:
        """Writes, hang-ups and combined masks keep Twisted's full handling."""
        a, b, c = Descriptor(), Descriptor(), Descriptor()
        recorder = self.dispatch([(1, OUT), (2, IN | HUP), (3, IN | OUT)], {1: a, 2: b, 3: c})
        self.assertEqual(recorder.handled, [(a, 1, OUT), (b, 2, IN | HUP), (c, 3, IN | OUT)])
        self.assertEqual((a.reads, b.reads, c.reads), (0, 0, 0))

    def test_unknownDescriptorSkipped(self) -> None:
        """An event for a descriptor no longer registered is ignored."""
        d = Descriptor()
        recorder = self.dispatch([(9, IN), (5, IN)], {5: d})
        self.assertEqual(d.reads, 1)
        self.assertEqual(recorder.handled, [])

    def test_removedEarlierInSamePollSkipped(self) -> None:
        """A descriptor an earlier event of the same poll removed gets no event."""
        gone = Descriptor()
        selectables = {4: Descriptor(), 7: gone}
        selectables[4].onRead = lambda: selectables.pop(7)
        self.dispatch([(4, IN), (7, IN)], selectables)
        self.assertEqual(gone.reads, 0)

    def test_readReasonDisconnects(self) -> None:
        """A read that answers a reason (connection over) disconnects the descriptor."""
        reason = Exception("done")
        d = Descriptor(why=reason)
        recorder = self.dispatch([(5, IN)], {5: d})
        self.assertEqual(recorder.disconnected, [(d, reason, True)])

    def test_readErrorLoggedAndDisconnects(self) -> None:
        """An exception from the read is logged and disconnects the descriptor; the
        events after it in the same poll still run."""
        error = ZeroDivisionError("boom")
        bad, good = Descriptor(error=error), Descriptor()
        recorder = self.dispatch([(5, IN), (6, IN)], {5: bad, 6: good})
        self.assertEqual(recorder.disconnected, [(bad, error, True)])
        self.assertEqual(good.reads, 1)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)


class InstallTests(SynchronousTestCase):
    """The proxy reactor is installed only where no reactor is yet."""

    def test_installedReactorKept(self) -> None:
        """In a process that already has a reactor, ``install`` returns that one."""
        from twisted.internet import reactor

        self.assertIs(eventloop.install(), reactor)

    def test_freshProcessGetsProxyReactor(self) -> None:
        """In a fresh process, ``install`` installs the proxy's reactor, which runs."""
        code = (
            "from nvpair.proxy.runtime import eventloop\n"
            "r = eventloop.install()\n"
            "from twisted.internet import reactor\n"
            "assert r is reactor\n"
            "r.callLater(0, r.stop)\n"
            "r.run()\n"
            "print(type(r).__name__)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "ProxyReactor")


class Poller:
    """An epoll stand-in: answers one list of events, or raises."""

    def __init__(
        self, events: list[tuple[int, int]] | None = None, error: OSError | None = None
    ) -> None:
        self.events = events or []
        self.error = error
        self.calls: list[tuple[float, int]] = []

    def poll(self, timeout: float, maxevents: int) -> list[tuple[int, int]]:
        self.calls.append((timeout, maxevents))
        if self.error is not None:
            raise self.error
        return self.events


def pollingReactor(poller: Poller, selectables: dict[int, Descriptor]) -> ProxyReactor:
    """A ``ProxyReactor`` with only what ``doPoll`` uses: no epoll, no waker, no signals."""
    reactor = ProxyReactor.__new__(ProxyReactor)
    reactor._poller = poller
    reactor._selectables = selectables
    reactor.atTurnEnd = []
    return reactor


class DoPollTests(SynchronousTestCase):
    """``doPoll`` waits as asked and runs what the poll returned."""

    def test_waitsAndDispatches(self) -> None:
        """The timeout is passed on (``None``: wait indefinitely), at most one event per
        registered descriptor is asked for, and the ready descriptor is read."""
        d = Descriptor()
        poller = Poller([(5, IN)])
        reactor = pollingReactor(poller, {5: d, 6: Descriptor()})
        reactor.doPoll(0.25)
        reactor.doPoll(None)
        self.assertEqual(poller.calls, [(0.25, 2), (-1, 2)])
        self.assertEqual(d.reads, 2)

    def test_interruptedPollIsQuiet(self) -> None:
        """A poll interrupted by a signal just returns (the loop polls again)."""
        reactor = pollingReactor(Poller(error=InterruptedError(errno.EINTR, "EINTR")), {})
        reactor.doPoll(1.0)

    def test_otherPollErrorsRaise(self) -> None:
        """Any other poll failure is a programming error and is raised."""
        reactor = pollingReactor(Poller(error=OSError(errno.EBADF, "EBADF")), {})
        self.assertRaises(OSError, reactor.doPoll, 1.0)


class TurnEndTests(SynchronousTestCase):
    """What is asked for during a turn runs when it ends: after all of a poll's events, and
    (asked for by a timer) before the next wait."""

    def test_afterThePollsEvents(self) -> None:
        """Asked for by the first of two ready descriptors, the call runs once, after both
        were read, and not again on the next turn."""
        first, second = Descriptor(), Descriptor()
        seen: list[tuple[int, int]] = []
        reactor = pollingReactor(Poller([(5, IN), (6, IN)]), {5: first, 6: second})
        verifyObject(ITurnEnd, reactor)
        first.onRead = lambda: reactor.callAtTurnEnd(
            lambda: seen.append((first.reads, second.reads))
        )
        reactor.doPoll(0)
        self.assertEqual(seen, [(1, 1)])
        first.onRead = None
        reactor.doPoll(0)
        self.assertEqual(seen, [(1, 1)])

    def test_timersCallsRunBeforeTheWait(self) -> None:
        """A call asked for outside a poll (a timer ran) is done before the reactor waits:
        what it writes is not held for the next event."""
        poller = Poller()
        reactor = pollingReactor(poller, {})
        waitsBefore: list[int] = []
        reactor.callAtTurnEnd(lambda: waitsBefore.append(len(poller.calls)))
        reactor.doPoll(5.0)
        self.assertEqual(waitsBefore, [0])
        self.assertEqual(poller.calls, [(5.0, 0)])

    def test_failingCallLoggedOthersRun(self) -> None:
        """A call that raises is logged; the others still run, those it asked for too."""
        reactor = pollingReactor(Poller(), {})
        ran: list[str] = []

        def failing() -> None:
            reactor.callAtTurnEnd(lambda: ran.append("asked by the failing one"))
            raise ZeroDivisionError()

        reactor.callAtTurnEnd(failing)
        reactor.callAtTurnEnd(lambda: ran.append("next"))
        reactor.doPoll(0)
        self.assertEqual(ran, ["next", "asked by the failing one"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(reactor.atTurnEnd, [])


@implementer(IReadDescriptor)
class PipeReader:
    """The read end of a pipe as a reactor reader: records reads and how it was lost."""

    def __init__(self, fd: int, error: BaseException | None = None) -> None:
        self.fd = fd
        self.error = error
        self.data: list[bytes] = []
        self.lost: list[Failure] = []

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "pipe"

    def doRead(self) -> Reason | None:  # type: ignore[override]
        if self.error is not None:
            raise self.error
        data = os.read(self.fd, 4096)
        if not data:
            return ConnectionDone()
        self.data.append(data)
        return None

    def connectionLost(self, reason: Failure) -> None:
        self.lost.append(reason)


class RelianceTests(SynchronousTestCase):
    """Pins what ``ProxyReactor`` takes from Twisted's epoll reactor, on a real one (a pipe
    and an epoll descriptor, no sockets, no waiting): the attributes exist, ``_selectables``
    follows ``addReader``/``removeReader``, ``_poller.poll`` reports the pipe, and
    ``_doReadOrWrite``/``_disconnectSelectable`` do what ``dispatchEvents`` hands them."""

    def setUp(self) -> None:
        readEnd, self.writeEnd = os.pipe()
        os.set_blocking(readEnd, False)
        self.addCleanup(self.closeFd, readEnd)
        self.addCleanup(self.closeFd, self.writeEnd)
        self.readEnd = readEnd
        self.reactor = ProxyReactor()
        self.addCleanup(self.closeReactor)  # cleanups run last first: before the pipe closes

    def closeFd(self, fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            pass

    def closeReactor(self) -> None:
        self.reactor.removeAll()
        self.reactor.waker.connectionLost(None)
        self.reactor._poller.close()

    def test_reliedOnNamesExist(self) -> None:
        """Every name ``install`` checks is there on this Twisted's epoll reactor."""
        self.assertIsInstance(self.reactor, EPollReactor)
        for name in eventloop._RELIED_ON:
            self.assertTrue(hasattr(self.reactor, name), name)
        self.assertIsInstance(self.reactor._poller, select.epoll)

    def test_selectablesFollowReaders(self) -> None:
        """``_selectables`` maps a reader's descriptor to it while it is registered."""
        reader = PipeReader(self.readEnd)
        self.reactor.addReader(reader)
        self.assertIs(self.reactor._selectables[self.readEnd], reader)
        self.reactor.removeReader(reader)
        self.assertNotIn(self.readEnd, self.reactor._selectables)

    def test_readablePipeReadOnce(self) -> None:
        """A readable pipe is one plain read event, read once by ``doPoll``."""
        reader = PipeReader(self.readEnd)
        self.reactor.addReader(reader)
        os.write(self.writeEnd, b"ping")
        self.assertIn(
            (self.readEnd, select.EPOLLIN),
            self.reactor._poller.poll(0, len(self.reactor._selectables)),
        )
        self.reactor.doPoll(0)
        self.assertEqual(reader.data, [b"ping"])
        self.reactor.doPoll(0)
        self.assertEqual(reader.data, [b"ping"])

    def test_hangUpGoesThroughTwisted(self) -> None:
        """A hang-up (not a plain read) goes to ``_doReadOrWrite``, which disconnects the
        reader: removed from the reactor, ``connectionLost`` with ``ConnectionDone``."""
        reader = PipeReader(self.readEnd)
        self.reactor.addReader(reader)
        os.close(self.writeEnd)
        self.assertIn(
            (self.readEnd, select.EPOLLHUP),
            self.reactor._poller.poll(0, len(self.reactor._selectables)),
        )
        self.reactor.doPoll(0)
        self.assertNotIn(reader, self.reactor.getReaders())
        self.assertEqual(len(reader.lost), 1)
        reader.lost[0].trap(ConnectionDone)

    def test_disconnectSelectable(self) -> None:
        """``_disconnectSelectable`` with a read's reason removes the reader and tells it why."""
        reader = PipeReader(self.readEnd)
        self.reactor.addReader(reader)
        self.reactor._disconnectSelectable(reader, ConnectionLost(), True)
        self.assertNotIn(reader, self.reactor.getReaders())
        reader.lost[0].trap(ConnectionLost)

    def test_readErrorDisconnects(self) -> None:
        """A read that raises is logged, and the reader is removed and told it is lost."""
        reader = PipeReader(self.readEnd, error=ZeroDivisionError("boom"))
        self.reactor.addReader(reader)
        os.write(self.writeEnd, b"x")
        self.reactor.doPoll(0)
        self.assertNotIn(reader, self.reactor.getReaders())
        self.assertEqual(len(reader.lost), 1)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)


class FallbackTests(SynchronousTestCase):
    """Where Twisted no longer has what ``ProxyReactor`` relies on, the stock reactor runs."""

    def test_missingNameInstallsStockReactor(self) -> None:
        """With one relied-on name missing, a fresh process gets Twisted's epoll reactor."""
        code = (
            "from nvpair.proxy.runtime import eventloop\n"
            "eventloop._RELIED_ON += ('_goneInAFutureTwisted',)\n"
            "r = eventloop.install()\n"
            "r.callLater(0, r.stop)\n"
            "r.run()\n"
            "print(type(r).__name__)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "EPollReactor")
