"""Shares that cannot be minted and a bound one app cannot take (spec §11 "The queue";
issue 32 items 2 and 3): declared clients' weighted shares, the one unverified share fair
inside, never-seen keys behind those waiting, and a full queue that refuses the client with
the most waiting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import FairQueue, Ticket
from nvpair.proxy.flow.shares import Shares


def declared(name: str, weight: float = 1.0) -> Client:
    """A declared client's request."""
    return Client("d:" + name, name, weight)


def serve(
    queue: FairQueue[str], arrivals: Callable[[Client, int], Client | None], pops: int
) -> Counter[str]:
    """A one-slot engine: ``pops`` dispatches; after each, ``arrivals(served, n)`` may send
    the next request (a closed loop: each client sends again once answered).  Counts the
    dispatches per share label, or per key for unverified keys named ``honest``."""
    served: Counter[str] = Counter()
    for n in range(pops):
        ticket = queue.pop(float(n))
        assert ticket is not None
        client = ticket.client
        served[client.key if client.key == "honest" else client.label] += 1
        following = arrivals(client, n)
        if following is not None:
            queue.push(Ticket(following, float(n), ticket.payload))
    return served


class MintedKeyTests(SynchronousTestCase):
    """A key never seen joins behind the clients already waiting (no declarations)."""

    def test_newKeyPerRequestGetsNoExtraShare(self) -> None:
        """A greedy app keeping 20 requests waiting, each with a key never seen, against an
        honest app sending one at a time with one key: the honest app gets half of the
        engine (before the rule a fresh key started level with the least served, and the
        honest app got nearly nothing)."""
        queue: FairQueue[str] = FairQueue(64)
        queue.charge(Client("honest"))  # the honest app has used the engine before
        minted = iter(range(10**6))
        for _ in range(20):
            queue.push(Ticket(Client(f"g{next(minted)}"), 0.0, "greedy"))
        queue.push(Ticket(Client("honest"), 0.0, "honest"))

        def arrivals(client: Client, n: int) -> Client:
            return client if client.key == "honest" else Client(f"g{next(minted)}")

        served = serve(queue, arrivals, 100)
        self.assertGreaterEqual(served["honest"], 45)

    def test_oneKeyGreedyHalves(self) -> None:
        """The same greedy app with one key: the honest app gets half too (the figure the
        minted case is measured against)."""
        queue: FairQueue[str] = FairQueue(64)
        queue.charge(Client("honest"))
        for _ in range(20):
            queue.push(Ticket(Client("greedy"), 0.0, "greedy"))
        queue.push(Ticket(Client("honest"), 0.0, "honest"))
        served = serve(queue, lambda client, n: client, 100)
        self.assertGreaterEqual(served["honest"], 49)

    def test_neverSeenJoinsBehind(self) -> None:
        """A key never seen starts one step behind the largest tag waiting: after each
        waiting client's next request, not before."""
        queue: FairQueue[str] = FairQueue(16)
        queue.charge(Client("a"))
        queue.charge(Client("b"))
        for key in ("a", "b"):
            for i in range(3):
                queue.push(Ticket(Client(key), float(i), f"{key}{i}"))
        queue.push(Ticket(Client("new"), 0.0, "new0"))
        order = [queue.pop(5.0).payload for _ in range(3)]  # type: ignore[union-attr]
        self.assertEqual(order[:2], ["a0", "b0"])
        self.assertIn("new0", [*order, queue.pop(5.0).payload])  # type: ignore[union-attr]

    def test_freshShareLevelAtTopLevel(self) -> None:
        """Declared shares cannot be minted: one not seen before starts at the virtual
        time, level with the least served (``Shares`` without ``newBehind``)."""
        shares = Shares()
        shares.charge("a")
        shares.charge("a")
        shares.waiting("a")
        self.assertEqual(shares.tag("b"), shares.virtual)
        behind = Shares(newBehind=True)
        behind.charge("a")
        behind.waiting("a")
        self.assertEqual(behind.tag("b"), behind.active["a"] + 1.0)


class DeclaredShareTests(SynchronousTestCase):
    """Declared clients get their own share, weighted; the rest share one."""

    def test_weights(self) -> None:
        """Two backlogged declared clients of weight 2 and 1 are served 2 : 1."""
        queue: FairQueue[str] = FairQueue(64)
        for client in (declared("ide", 2.0), declared("batch")):
            for _ in range(10):
                queue.push(Ticket(client, 0.0, client.label))
        served = serve(queue, lambda client, n: client, 60)
        self.assertEqual(served, Counter({"ide": 40, "batch": 20}))

    def test_unverifiedIsOneShare(self) -> None:
        """Ten backlogged unverified keys together get what one declared client gets."""
        queue: FairQueue[str] = FairQueue(128)
        ide = declared("ide")
        for _ in range(10):
            queue.push(Ticket(ide, 0.0, "ide"))
        for k in range(10):
            for _ in range(5):
                queue.push(Ticket(Client(f"u{k}"), 0.0, "u"))
        served = serve(queue, lambda client, n: client, 80)
        self.assertEqual(served, Counter({"ide": 40, "unverified": 40}))

    def test_fairInsideUnverified(self) -> None:
        """Inside the unverified share its keys are served in turn."""
        queue: FairQueue[str] = FairQueue(128)
        ide = declared("ide")
        for key in ("x", "y"):  # seen before, as often as ide
            queue.charge(Client(key))
            queue.charge(ide)
        for _ in range(10):
            queue.push(Ticket(ide, 0.0, "ide"))
        for key in ("x", "y"):
            for _ in range(10):
                queue.push(Ticket(Client(key), 0.0, key))
        byKey: Counter[str] = Counter()
        for n in range(40):
            ticket = queue.pop(float(n))
            assert ticket is not None
            byKey[ticket.client.key] += 1
            queue.push(Ticket(ticket.client, float(n), ticket.payload))
        self.assertEqual(byKey, Counter({"d:ide": 20, "x": 10, "y": 10}))

    def test_mintedKeysAgainstDeclared(self) -> None:
        """A greedy app minting a key per request, against a declared honest app sending
        one at a time: the honest app gets half of the engine."""
        queue: FairQueue[str] = FairQueue(64)
        minted = iter(range(10**6))
        for _ in range(20):
            queue.push(Ticket(Client(f"g{next(minted)}"), 0.0, "greedy"))
        queue.push(Ticket(declared("ide"), 0.0, "ide"))

        def arrivals(client: Client, n: int) -> Client:
            return client if client.share else Client(f"g{next(minted)}")

        served = serve(queue, arrivals, 100)
        self.assertGreaterEqual(served["ide"], 49)


class FullQueueTests(SynchronousTestCase):
    """A full queue refuses the client with the most waiting, never one with none."""

    def test_arrivalTakesTheLongestFifosNewest(self) -> None:
        """One app holds the whole queue: another app's request takes the place of that
        app's newest request, which is left out; the greedy app's own next is refused."""
        queue: FairQueue[str] = FairQueue(4)
        for i in range(4):
            queue.push(Ticket(Client("greedy"), float(i), f"g{i}"))
        left = queue.push(Ticket(Client("honest"), 5.0, "h0"))
        self.assertEqual(left.payload if left else None, "g3")
        self.assertFalse(left.waiting if left else True)
        self.assertEqual(len(queue), 4)
        again = Ticket(Client("greedy"), 6.0, "g4")
        self.assertIs(queue.push(again), again)
        self.assertEqual(sorted(t.payload for t in queue), ["g0", "g1", "g2", "h0"])

    def test_nothingWaitingAlwaysGetsAPlace(self) -> None:
        """Minted keys fill the queue one request each: a further key, with nothing
        waiting, still gets a place (never a client with nothing waiting is refused): the
        newest of the key that ranks first gives way — on equal lengths the most served,
        and a never-seen key, behind all, ranks first; so does an honest app's request."""
        queue: FairQueue[str] = FairQueue(4)
        queue.charge(Client("honest"))
        for i in range(4):
            queue.push(Ticket(Client(f"g{i}"), float(i), f"g{i}"))
        left = queue.push(Ticket(Client("g9"), 9.0, "g9"))
        self.assertEqual(left.payload if left else None, "g3")
        left = queue.push(Ticket(Client("honest"), 10.0, "h0"))
        self.assertEqual(left.payload if left else None, "g9")
        self.assertEqual(sorted(t.payload for t in queue), ["g0", "g1", "g2", "h0"])

    def test_servedKeyOutranksMintedOnes(self) -> None:
        """An honest app served often comes back with the largest tag of the one-request
        FIFOs; a minted key arriving at the full queue still takes a minted key's place,
        and so does the queue's shedding: a key charged at most one dispatch (even one that
        bounced and came back to wait) gives way first."""
        queue: FairQueue[str] = FairQueue(3)
        honest = Client("honest")
        for _ in range(6):
            queue.charge(honest)  # dispatched at once, nothing waiting
        queue.charge(Client("m1"))  # dispatched once, bounced off the busy engine
        queue.push(Ticket(Client("m1"), 1.0, "m1"))
        queue.push(Ticket(Client("m2"), 2.0, "m2"))
        queue.charge(honest)  # served once more while the minted keys wait
        queue.push(Ticket(honest, 3.0, "h0"))
        left = queue.push(Ticket(Client("m3"), 4.0, "m3"))
        self.assertEqual(left.payload if left else None, "m2")
        shed = queue.shed()
        self.assertEqual(shed.payload if shed else None, "m3")
        self.assertEqual(sorted(t.payload for t in queue), ["h0", "m1"])

    def test_unverifiedGivesWayToDeclared(self) -> None:
        """On equal lengths an unverified key gives way before a declared client."""
        queue: FairQueue[str] = FairQueue(2)
        queue.push(Ticket(declared("ide"), 0.0, "ide0"))
        queue.push(Ticket(Client("k"), 1.0, "k0"))
        left = queue.push(Ticket(declared("batch"), 2.0, "batch0"))
        self.assertEqual(left.payload if left else None, "k0")

    def test_moreWaitingIsRefused(self) -> None:
        """An arrival whose client would then have the most waiting is refused itself."""
        queue: FairQueue[str] = FairQueue(4)
        for i in range(2):
            queue.push(Ticket(Client("a"), float(i), f"a{i}"))
            queue.push(Ticket(Client("b"), float(i), f"b{i}"))
        arriving = Ticket(Client("a"), 5.0, "a2")
        self.assertIs(queue.push(arriving), arriving)
        self.assertEqual(len(queue), 4)

    @given(st.lists(st.integers(0, 30), min_size=1, max_size=300))
    def test_boundHeldPastItsLimit(self, keys: list[int]) -> None:
        """Whatever arrives, the queue never holds more than its bound, a full queue leaves
        out exactly one request per arrival, and what it leaves out is from a client with
        at least as many waiting as the arrival's."""
        queue: FairQueue[str] = FairQueue(8)
        for n, k in enumerate(keys):
            client = declared(f"d{k}") if k % 3 == 0 else Client(f"k{k}")
            full = len(queue) == 8
            mine = sum(1 for t in queue if t.client == client)
            left = queue.push(Ticket(client, float(n), f"{k}/{n}"))
            self.assertLessEqual(len(queue), 8)
            self.assertEqual(left is not None, full)
            if left is not None and left.client != client:
                theirs = sum(1 for t in queue if t.client == left.client) + 1
                self.assertGreaterEqual(theirs, mine + 1)
