"""The fleet file's ``[[client]]`` tables (protocol §9; spec §11 "The fleet file"): parsed
and validated whole, refused with a line (never echoing a key), shown by ``--check-fleet``
and ``/status``, and followed live by the queue on reload."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.fleetclients import MAX_CLIENTS
from nvpair.proxy.facade.fleetfile import FleetError, FleetSpec, parseFleet
from nvpair.proxy.facade.reload import ReloadResult, findReloader
from nvpair.proxy.flow.clients import DeclaredClient
from nvpair.proxy.ops.queuegauges import queueStatus
from nvpair.proxy.ops.server import statusDocument
from nvpair.proxy.service import ProxyService
from tests.fleetconf.filekit import FleetFile
from tests.ops.opskit import makeService
from tests.support.cases.fleettext import tomlValue

PATH = "/etc/nvpair/fleet.toml"
BACKEND = '[[backend]]\nengine = "llamacpp"\nurl = "http://10.0.0.1:8081"\n'
IDE = hashlib.sha256(b"Bearer sk-ide").hexdigest()
BATCH = hashlib.sha256(b"Bearer sk-batch").hexdigest()


def client(name: str, key: str, extra: str = "") -> str:
    """One ``[[client]]`` table."""
    return f'[[client]]\nname = "{name}"\nkey_sha256 = "{key}"\n{extra}'


def parse(text: str) -> FleetSpec:
    """Parse ``text`` as the file at ``PATH``."""
    return parseFleet(text.encode("utf-8"), PATH)


class ValidClientTests(SynchronousTestCase):
    """What declared clients mean."""

    def test_contract(self) -> None:
        """Name, key (lower-cased) and weight (default 1) in file order."""
        spec = parse(BACKEND + client("ide", IDE.upper(), "weight = 2\n") + client("b", BATCH))
        self.assertEqual(
            spec.clients, (DeclaredClient("ide", IDE, 2.0), DeclaredClient("b", BATCH, 1.0))
        )

    def test_noneDeclared(self) -> None:
        """A file without ``[[client]]`` declares none (every client is unverified)."""
        self.assertEqual(parse(BACKEND).clients, ())

    def test_summaryShowsNames(self) -> None:
        """``--check-fleet``'s line names the declared clients and their weights, never
        their keys."""
        spec = parse(BACKEND + client("ide", IDE, "weight = 2.5\n") + client("batch", BATCH))
        summary = spec.summary()
        self.assertEqual(summary, "fleet OK: llamacpp: 1 backend; clients: ide (weight 2.5), batch")
        self.assertNotIn(IDE, summary)


class BadClientTests(SynchronousTestCase):
    """Every bad ``[[client]]`` is one ``FleetError`` with its line; no key echoed."""

    def refused(self, text: str, line: int, words: str) -> None:
        """Assert ``BACKEND + text`` is refused at ``line`` (of ``text``) with ``words``."""
        with self.assertRaises(FleetError) as caught:
            parse(BACKEND + text)
        e = caught.exception
        self.assertEqual(e.line, line + BACKEND.count("\n"), str(e))
        self.assertIn(words, e.problem)
        self.assertNotIn(IDE, str(e))
        self.assertNotIn("sk-pasted", str(e))

    def test_unknownKey(self) -> None:
        """Unknown keys are errors, not ignored (protocol §9)."""
        self.refused(client("ide", IDE, "key = 1\n"), 4, "unknown key 'key' in [[client]]")

    def test_missing(self) -> None:
        """``name`` and ``key_sha256`` are required."""
        self.refused('[[client]]\nname = "ide"\n', 1, "has no key_sha256")
        self.refused(f'[[client]]\nkey_sha256 = "{IDE}"\n', 1, "has no name")

    def test_notADigest(self) -> None:
        """Not 64 hex digits (a pasted key, a short digest): refused, the value unsaid."""
        self.refused(client("ide", "Bearer sk-pasted"), 3, "64 hex digits")
        self.refused(client("ide", IDE[:63]), 3, "sha256sum")
        self.refused(client("ide", IDE[:63] + "g"), 3, "64 hex digits")
        self.refused('[[client]]\nname = "ide"\nkey_sha256 = 5\n', 3, "64 hex digits")

    def test_weights(self) -> None:
        """A weight is a number from 0.01 to 100; not a boolean, string, nan or inf."""
        for bad in ("0", "-1", "101", "0.001", "nan", "inf", "true", '"2"'):
            self.refused(client("ide", IDE, f"weight = {bad}\n"), 4, "weight must be")
        self.assertEqual(parse(BACKEND + client("i", IDE, "weight = 100\n")).clients[0].weight, 100)

    def test_names(self) -> None:
        """Names: 1 to 64 printable characters, once each, not a reserved label."""
        self.refused(client("", IDE), 2, "1 to 64 printable")
        self.refused(client("x" * 65, IDE), 2, "1 to 64 printable")
        self.refused(client("unverified", IDE), 2, "reserved")
        self.refused(client("other", IDE), 2, "reserved")
        self.refused(client("ide", IDE) + client("ide", BATCH), 5, "duplicate name 'ide'")
        self.refused('[[client]]\nname = 3\nkey_sha256 = "x"\n', 2, "name must be a string")

    def test_keysOnce(self) -> None:
        """Two clients with one key: refused, the key unsaid."""
        self.refused(client("a", IDE) + client("b", IDE), 6, "duplicate key_sha256")

    def test_shapes(self) -> None:
        """``client`` must be an array of tables (the line of the top-level key)."""
        for top, words in (("client = 1", "array of [[client]] tables"), ("client = [1]", "table")):
            with self.assertRaises(FleetError) as caught:
                parse(f"# clients\n{top}\n" + BACKEND)
            self.assertEqual(caught.exception.line, 2)
            self.assertIn(words, caught.exception.problem)

    def test_boundFilledPastIt(self) -> None:
        """At most ``MAX_CLIENTS``: one more is refused at its table."""
        text = "".join(
            client(f"c{i}", hashlib.sha256(b"%d" % i).hexdigest()) for i in range(MAX_CLIENTS + 1)
        )
        self.refused(text, 3 * MAX_CLIENTS + 1, f"more than {MAX_CLIENTS} clients")
        self.assertEqual(len(parse(BACKEND + text[: text.rindex("[[client]]")]).clients), 256)


_CLIENT_KEYS = st.sampled_from(["name", "key_sha256", "weight", "url", "x"])
_CLIENT_VALUES = st.one_of(
    st.integers(-5, 500),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: round(f, 3)),
    st.booleans(),
    st.sampled_from([IDE, BATCH, "ide", "unverified", IDE[:10]]),
    st.text(max_size=10),
)


def _value(value: object) -> str:
    return repr(value) if isinstance(value, float) else tomlValue(value)


@st.composite
def clientTexts(draw: st.DrawFn) -> str:
    """A backend, then client tables of random keys and values."""
    lines = [BACKEND]
    for _ in range(draw(st.integers(0, 4))):
        lines.append("[[client]]")
        keys = draw(st.lists(_CLIENT_KEYS, max_size=4, unique=True))
        lines += [f"{k} = {_value(draw(_CLIENT_VALUES))}" for k in keys]
    return "\n".join(lines) + "\n"


class ClientPropertyTests(SynchronousTestCase):
    """The parser never crashes on client tables: declared clients or a located error."""

    @settings(max_examples=400, deadline=None)
    @given(clientTexts())
    def test_arbitraryClients(self, text: str) -> None:
        """Arbitrary client-like TOML is parsed or refused with a line in the file."""
        try:
            spec = parse(text)
        except FleetError as e:
            self.assertGreaterEqual(e.line, 1)
            self.assertLessEqual(e.line, text.count("\n") + 1)
            return
        names = [c.name for c in spec.clients]
        self.assertEqual(len(names), len(set(names)))
        self.assertTrue(all(0.01 <= c.weight <= 100 for c in spec.clients))


class LiveClientTests(SynchronousTestCase):
    """The standalone process: declared clients in ``/status``, followed on reload."""

    def setUp(self) -> None:
        self.file = FleetFile(self, BACKEND + client("ide", IDE, "weight = 2\n"))
        self.reactor = MemoryReactorClock()
        self.service: ProxyService = makeService(
            self.reactor, "--standalone", "--ops-port", "0", "--fleet", self.file.path
        )
        self.service.startService()
        self.addCleanup(self.service.stopService)

    def test_statusAndReload(self) -> None:
        """``/status`` shows names and weights (no key); a reload that changes only the
        clients is applied and the queue follows it at once."""
        doc = statusDocument(self.service)
        assert doc["fleet"] is not None
        self.assertEqual(doc["fleet"]["clients"], [{"name": "ide", "weight": 2.0}])
        self.assertNotIn(IDE, repr(doc))
        queueing = self.service.context.queueing
        status = queueStatus(queueing)
        assert status is not None
        self.assertEqual(status["declaredClients"], ["ide"])
        self.file.write(BACKEND + client("batch", BATCH))
        reloader = findReloader(self.service)
        assert reloader is not None
        self.assertEqual(reloader.reload("signal"), ReloadResult.APPLIED)
        status = queueStatus(queueing)
        assert status is not None
        self.assertEqual(status["declaredClients"], ["batch"])
        self.file.write(BACKEND + client("batch", "not a digest"))
        self.assertEqual(reloader.reload("signal"), ReloadResult.INVALID)
        status = queueStatus(queueing)
        assert status is not None
        self.assertEqual(status["declaredClients"], ["batch"])  # an invalid file changes nothing
