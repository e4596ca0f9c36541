"""Conversation affinity: keys, the bounded table, the ordering rule, and the placement loop."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade.frontdoor import promptKeyer
from nvpair.proxy.facade.standalone import startStandalone
from nvpair.proxy.ops.server import affinityStatus
from nvpair.proxy.placement.affinity import Affinity, AffinityTable
from nvpair.proxy.placement.choose import Hold
from nvpair.proxy.placement.keys import MAX_LOOKUPS, MAX_MESSAGES, PROMPT_BLOCK, AffinityKey, keyFor
from nvpair.proxy.routing import admission
from nvpair.proxy.routing.candidates import Snapshot, orderCandidates
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.support.cases.optionparse import assertExitsNaming, parse
from tests.support.conversations import CHAT, chatKey, turn
from tests.support.fakerequest import FakeRequest
from tests.support.fakes.standalone import FakeService
from tests.support.fakeupstream import makeFacade, node, startExchange


class KeyTests(SynchronousTestCase):
    """Digests of the leading part of the prompt let a later turn find an earlier one."""

    def test_laterTurnFindsEarlierTurn(self) -> None:
        """Each later turn's lookups include every earlier turn's recorded digest within
        reach; another conversation's and another model's do not match."""
        first, second, third = (chatKey(turn(n)) for n in (1, 2, 3))
        self.assertIn(first.records[0], second.lookups)
        self.assertIn(second.records[0], third.lookups)
        self.assertIn(first.records[0], third.lookups)
        other = chatKey(turn(2, "cooking"))
        self.assertNotIn(first.records[0], other.lookups)
        self.assertNotIn(first.records[0], chatKey(turn(2), model="m2").lookups)
        self.assertEqual(second.lookups[0], second.records[0], "longest first: itself")

    def test_lookupsCapped(self) -> None:
        """A long history hashes every message but looks up only the longest prefixes."""
        key = chatKey(turn(100))
        self.assertEqual(len(key.lookups), MAX_LOOKUPS)
        self.assertIn(chatKey(turn(97)).records[0], key.lookups)
        self.assertNotIn(chatKey(turn(96)).records[0], key.lookups)

    def test_digestsOnly(self) -> None:
        """A key holds integers only, never text."""
        key = chatKey(turn(3))
        for value in (*key.lookups, *key.records, key.spread):
            self.assertIs(type(value), int)

    def test_unusualMessages(self) -> None:
        """Messages with tool calls or content parts still key (serialized canonically,
        key order not mattering); a non-list, empty or huge list gets no key."""
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function"}],
        }
        reordered = dict(reversed(list(call.items())))
        a = chatKey([*turn(1), call, {"role": "tool", "content": "42", "tool_call_id": "1"}])
        b = chatKey([*turn(1), reordered])
        self.assertIn(b.records[0], a.lookups)
        parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        self.assertIsNotNone(chatKey(parts))
        for messages in ("hi", [], [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)):
            self.assertIsNone(keyFor("llamacpp", "m1", CHAT, {"messages": messages}))

    def test_routes(self) -> None:
        """Chat routes key on messages, completion and generate routes on the prompt text,
        /v1/responses on its input; embeddings and other routes get no key."""
        self.assertIsNotNone(keyFor("ollama", "m1", b"/api/chat", {"messages": turn(1)}))
        self.assertIsNotNone(keyFor("ollama", "m1", b"/api/generate", {"prompt": "x"}))
        self.assertIsNotNone(keyFor("lmstudio", "m1", b"/v1/completions", {"prompt": ["x"]}))
        self.assertIsNotNone(keyFor("lmstudio", "m1", b"/v1/responses", {"input": "x"}))
        self.assertIsNotNone(keyFor("lmstudio", "m1", b"/v1/responses", {"input": turn(1)}))
        self.assertIsNone(keyFor("lmstudio", "m1", b"/v1/completions", {"prompt": [1, 2]}))
        self.assertIsNone(keyFor("ollama", "m1", b"/api/embed", {"input": "x"}))
        self.assertIsNone(keyFor("llamacpp", "m1", b"/v1/embeddings", {"input": "x"}))
        self.assertIsNone(keyFor("llamacpp", "m1", CHAT, None))

    def test_growingPrompt(self) -> None:
        """A prompt that extends an earlier one finds it through the earlier one's longest
        256·2^k-character prefix; an exact repeat finds it through the whole text; a
        different system text or a short unrelated prompt does not."""
        base = "".join(f"line {i}\n" for i in range(200))  # about 1.6k characters
        earlier = keyFor("ollama", "m1", b"/api/generate", {"prompt": base})
        later = keyFor("ollama", "m1", b"/api/generate", {"prompt": base + "more\n" * 50})
        again = keyFor("ollama", "m1", b"/api/generate", {"prompt": base})
        other = keyFor("ollama", "m1", b"/api/generate", {"prompt": base, "system": "s"})
        assert earlier and later and again and other
        self.assertEqual(len(earlier.records), 2)
        self.assertTrue(set(earlier.records) & set(later.lookups))
        self.assertIn(earlier.records[0], again.lookups)
        self.assertFalse(set(earlier.records) & set(other.lookups))
        short = keyFor("ollama", "m1", b"/api/generate", {"prompt": "x" * (PROMPT_BLOCK - 1)})
        assert short is not None
        self.assertEqual(len(short.records), 1)


class TableTests(SynchronousTestCase):
    """The table is capped in entries and in age, whatever the load."""

    def test_entriesCapped(self) -> None:
        """Beyond the cap the oldest entries go; size never exceeds the cap."""
        clock = Clock()
        table = AffinityTable(clock, maxEntries=100, maxAge=60)
        for digest in range(10_000):
            table.record(digest, "A")
            self.assertLessEqual(len(table), 100)
        self.assertEqual(len(table), 100)
        self.assertIsNone(table.lookup([0, 9899]))
        self.assertEqual(table.lookup([9900]), "A")

    def test_ageCapped(self) -> None:
        """An entry older than the age cap is never returned, and is pruned by later records."""
        clock = Clock()
        table = AffinityTable(clock, maxEntries=100, maxAge=60)
        table.record(1, "A")
        clock.advance(59)
        table.record(2, "B")
        self.assertEqual(table.lookup([1]), "A")
        clock.advance(2)
        self.assertIsNone(table.lookup([1]))
        self.assertEqual(table.lookup([1, 2]), "B")
        table.record(3, "C")
        self.assertEqual(len(table), 2, "the expired entry was pruned")

    def test_rerecordMoves(self) -> None:
        """Recording a known digest again refreshes it and points it at the new node."""
        clock = Clock()
        table = AffinityTable(clock, maxEntries=2, maxAge=60)
        table.record(1, "A")
        table.record(2, "A")
        table.record(1, "B")
        table.record(3, "A")
        self.assertEqual(table.lookup([1]), "B")
        self.assertIsNone(table.lookup([2]))

    def test_longestFirst(self) -> None:
        """The first digest of the lookup list that is known wins."""
        table = AffinityTable(Clock())
        table.record(1, "A")
        table.record(2, "B")
        self.assertEqual(table.lookup([3, 2, 1]), "B")


class PlaceTests(SynchronousTestCase):
    """Home first unless overloaded; otherwise least-loaded, ties spread by the key."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.reservations = ReservationMap()
        self.affinity = Affinity(self.clock, self.reservations)
        self.reservations.applyPriority(0, ["A", "B", "C"], {})
        engine = ENGINES["llamacpp"]
        self.snapshot = Snapshot([node("A"), node("B"), node("C")], engine.normalize)

    def place(self, key: AffinityKey, count: bool = True) -> str:
        owners = self.snapshot.owners("m1", False)
        ordered, _ = orderCandidates(owners, None, self.reservations.rank)
        choice = self.affinity.place(ordered, key, "m1", Hold.NONE, "llamacpp" if count else None)
        assert choice is not None
        self.assertIs(ordered[0], choice.node)
        return choice.node.id

    def load(self, nodeId: str, n: int) -> None:
        for _ in range(n):
            self.reservations.reserve(nodeId)

    def test_homeFirst(self) -> None:
        """The node that served the previous turn goes first even when it is not first in
        the given order, and while it has up to two requests more than the least loaded."""
        self.affinity.served(chatKey(turn(1)), "C")
        self.assertEqual(self.place(chatKey(turn(2))), "C")
        self.load("C", 2)
        self.assertEqual(self.place(chatKey(turn(2))), "C")
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 2, "miss": 0, "overridden": 0})

    def test_overloadedHome(self) -> None:
        """Home three requests above the least loaded: the least-loaded owner goes first."""
        self.affinity.served(chatKey(turn(1)), "C")
        self.load("C", 3)
        self.load("A", 1)
        self.assertEqual(self.place(chatKey(turn(2))), "B")
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 0, "miss": 0, "overridden": 1})

    def test_homeNotOwner(self) -> None:
        """A home that no longer owns the model (or is down) is a miss."""
        self.affinity.served(chatKey(turn(1)), "gone")
        self.place(chatKey(turn(2)))
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 0, "miss": 1, "overridden": 0})

    def test_newConversationsSpread(self) -> None:
        """Distinct new conversations arriving one at a time on an idle fleet land on every
        owner, and the same conversation always lands on the same one."""
        chosen = [self.place(chatKey(turn(1, f"topic {i}"))) for i in range(60)]
        self.assertEqual(set(chosen), {"A", "B", "C"})
        for count in (chosen.count(n) for n in "ABC"):
            self.assertGreater(count, 5)
        again = [self.place(chatKey(turn(1, f"topic {i}"))) for i in range(60)]
        self.assertEqual(chosen, again)

    def test_leastLoadedBeforeTies(self) -> None:
        """A new conversation never goes to a busier owner than the least loaded."""
        self.load("A", 1)
        self.load("B", 1)
        for i in range(20):
            self.assertEqual(self.place(chatKey(turn(1, f"topic {i}", ""))), "C")

    def test_shortPromptHasNoHome(self) -> None:
        """A short prompt sent again (cheaper to recompute than ``MIN_MATCH_SECONDS``) goes
        to the least-loaded owner, not back to the node that served it (its home would fill
        a slot another model's request needs); a client-named group keeps its home."""
        short = turn(1, "hi", "")
        self.affinity.served(chatKey(short), "C")
        self.load("C", 1)
        self.assertNotEqual(self.place(chatKey(short)), "C")
        grouped = keyFor(
            "llamacpp", "m1", CHAT, {"model": "m1", "messages": short, "prompt_cache_key": "g"}
        )
        assert grouped is not None
        self.affinity.served(grouped, "C")
        self.assertEqual(self.place(grouped), "C")
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 1, "miss": 1, "overridden": 0})

    def test_countedOnce(self) -> None:
        """A later round of the same request (``engineId`` None) is not counted again."""
        key = chatKey(turn(1))
        self.place(key)
        self.place(key, count=False)
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 0, "miss": 1, "overridden": 0})

    def test_status(self) -> None:
        """The status view names the limits and the counts, never a digest."""
        self.affinity.served(chatKey(turn(1)), "A")
        self.place(chatKey(turn(2)))
        service = SimpleNamespace(
            affinity=self.affinity, settings=SimpleNamespace(affinity="prefix")
        )
        status = affinityStatus(service)
        self.assertEqual(status["mode"], "prefix")
        self.assertTrue(status["active"])
        self.assertEqual(status["entries"], 1)
        self.assertEqual(status["counts"], {"llamacpp": {"hit": 1, "miss": 0, "overridden": 0}})
        json.dumps(status)


def body(messages: list[Any]) -> bytes:
    return json.dumps({"model": "m1", "stream": True, "messages": messages}).encode()


class LoopTests(SynchronousTestCase):
    """The standalone inference loop orders by affinity and records the committing node."""

    def setUp(self) -> None:
        self.context = FakeContext()
        self.context.reservations.applyPriority(0, ["A", "B"], {})
        self.affinity = Affinity(self.context.clock, self.context.reservations)
        self.context.affinity = self.affinity
        self.facade = makeFacade(self.context.clock, [node("A"), node("B")])

    def serve(self, messages: list[Any], *statuses: int) -> str:
        """Admit and run one chat turn; the engines answer ``statuses`` then 200."""
        ex, request = startExchange(self.context, self.facade, FakeRequest(), body=body(messages))
        for status in statuses:
            self.context.upstream.last().answer(status, b"{}")
        self.context.upstream.last().answer(200, b"data: [DONE]\n\n")
        self.assertEqual(request.code, 200)
        served = request.header(b"x-nvpair-node")
        assert served is not None
        return served[0].decode()

    def test_turnsStayAndFailoverMoves(self) -> None:
        """Later turns go to the node of the first; a 503 there moves the conversation to the
        node that served, and the turns after follow it."""
        home = self.serve(turn(1))
        self.assertEqual(self.serve(turn(2)), home)
        other = {"A": "B", "B": "A"}[home]
        self.assertEqual(self.serve(turn(3), 503), other)
        self.assertEqual(self.serve(turn(4)), other)
        self.assertEqual(self.affinity.countsOf("llamacpp"), {"hit": 3, "miss": 1, "overridden": 0})

    def test_admissionCarriesDigests(self) -> None:
        """An admitted inference request carries its prompt's digests where a keyer asked
        for them (taking no part in the decision's equality), never the parsed body; the
        exchange keeps the same digests."""
        raw = body(turn(1))
        request = FakeRequest()
        keyer = promptKeyer(self.context, self.facade, request)
        assert keyer is not None
        decision = admission.admit(ENGINES["llamacpp"], b"POST", CHAT, raw, keyer)
        assert isinstance(decision, admission.Admitted)
        assert decision.prefixKey is not None
        self.assertEqual(decision.prefixKey.records, chatKey(turn(1)).records)
        same: admission.Admitted[None] = admission.Admitted(
            decision.routeClass, decision.model, decision.facts
        )
        self.assertEqual(decision, same)
        self.assertFalse(hasattr(decision, "document"))
        ex, _ = startExchange(self.context, self.facade, request, body=raw)
        assert ex.prefixKey is not None
        self.assertEqual(ex.prefixKey.records, chatKey(turn(1)).records)
        self.assertFalse(hasattr(ex, "document"))

    def test_pinWins(self) -> None:
        """A pin still decides, and nothing is counted."""
        self.facade.pin = "B"
        self.assertEqual(self.serve(turn(1)), "B")
        self.assertEqual(self.affinity.counts, {})


class OptionTests(SynchronousTestCase):
    """``--affinity prefix|off`` (env ``NVPAIR_PROXY_AFFINITY``), default ``prefix``."""

    def test_values(self) -> None:
        """Default prefix; off; case-insensitive; the flag wins over the environment."""
        self.assertEqual(parse([]).affinity, "prefix")
        self.assertEqual(parse(["--affinity", "off"]).affinity, "off")
        self.assertEqual(parse(["--affinity", "Prefix"]).affinity, "prefix")
        env = {"NVPAIR_PROXY_AFFINITY": "off"}
        self.assertEqual(parse([], env).affinity, "off")
        self.assertEqual(parse(["--affinity=prefix"], env).affinity, "prefix")

    def test_malformed(self) -> None:
        """An unknown mode exits 2 with one stderr line naming the option."""
        assertExitsNaming(
            self,
            "--affinity",
            ((["--affinity", "sticky"], {}), ([], {"NVPAIR_PROXY_AFFINITY": "on"})),
        )


class StandaloneWiringTests(SynchronousTestCase):
    """Standalone mode with ``prefix`` gives the service an ``Affinity``; ``off`` does not."""

    def test_wiring(self) -> None:
        """``prefix``: an Affinity; ``off``: none."""
        off = FakeService(("llamacpp",), (), affinity="off")
        off.startService()
        startStandalone(off)
        self.assertIsNone(off.affinity)
        self.assertEqual(affinityStatus(off), {"mode": "off", "active": False})
        off.stopService()
        on = FakeService(("llamacpp",), (), affinity="prefix")
        on.startService()
        startStandalone(on)
        self.assertIsInstance(on.affinity, Affinity)
        self.assertTrue(affinityStatus(on)["active"])
        on.stopService()


class SingleNodeTests(SynchronousTestCase):
    """A fleet of one node has no choice to make: nothing is keyed, recorded or counted."""

    def test_singleNodeFleet(self) -> None:
        """One backend: served as usual, the table stays empty, no count."""
        context = FakeContext()
        context.reservations.applyPriority(0, ["A"], {})
        affinity = Affinity(context.clock, context.reservations)
        context.affinity = affinity
        facade = makeFacade(context.clock, [node("A")])
        for n in (1, 2):
            ex, request = startExchange(context, facade, FakeRequest(), body=body(turn(n)))
            context.upstream.last().answer(200, b"data: [DONE]\n\n")
            self.assertEqual(request.code, 200)
        self.assertEqual(len(affinity.table), 0)
        self.assertEqual(affinity.counts, {})

    def test_twoNodesOneOwner(self) -> None:
        """Two nodes of which one owns the model: keyed and recorded, so the conversation
        has a home when the other node comes to own the model too."""
        context = FakeContext()
        context.reservations.applyPriority(0, ["A", "B"], {})
        affinity = Affinity(context.clock, context.reservations)
        context.affinity = affinity
        facade = makeFacade(context.clock, [node("A", models=("other",)), node("B")])
        ex, request = startExchange(context, facade, FakeRequest(), body=body(turn(1)))
        context.upstream.last().answer(200, b"data: [DONE]\n\n")
        self.assertEqual(affinity.countsOf("llamacpp"), {"hit": 0, "miss": 1, "overridden": 0})
        self.assertEqual(affinity.table.lookup(chatKey(turn(2)).lookups), "B")
