"""Tests for facade.hostcheck: the loopback ``Host`` rule (protocol §8) and its gate."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.hostcheck import (
    CACHE_KEY_MAX,
    CACHE_SIZE,
    LOG_NAME_MAX,
    LOGGED_NAMES,
    HostGate,
    HostRule,
    ownNames,
    parseAllowedHosts,
    parseHost,
)
from nvpair.proxy.options import Options
from nvpair.proxy.settings import Settings
from tests.support.cases.optionparse import assertExitsNaming
from tests.support.fakes.logevents import Events

HOSTNAME = "Workstation"


def rule(*allowed: str) -> HostRule:
    """A rule on a machine called ``Workstation`` with ``allowed`` as ``--allowed-hosts``."""
    return HostRule(parseAllowedHosts(",".join(allowed)), hostname=HOSTNAME)


class ParseHostTests(SynchronousTestCase):
    """``parseHost`` returns the normalized name without its port, or ``None`` if malformed."""

    def test_names(self) -> None:
        """Names lose their port and one trailing dot and are lower-cased."""
        cases = {
            b"localhost": "localhost",
            b"LocalHost:11434": "localhost",
            b"localhost.": "localhost",
            b"localhost.:80": "localhost",
            b"Api.Example.COM:1": "api.example.com",
            b"localhost:": "localhost",
            b"under_score.local": "under_score.local",
            b"xn--bcher-kva.example": "xn--bcher-kva.example",
        }
        for value, name in cases.items():
            self.assertEqual(parseHost(value), name, value)

    def test_addresses(self) -> None:
        """IPv4 dotted quads stay; IPv6 literals lose brackets and port and are compressed."""
        cases = {
            b"127.0.0.1": "127.0.0.1",
            b"127.0.0.1:11435": "127.0.0.1",
            b"127.0.0.1.": "127.0.0.1",
            b"[::1]": "::1",
            b"[::1]:8080": "::1",
            b"[0:0:0:0:0:0:0:1]": "::1",
            b"[::FFFF:127.0.0.1]:1": "::ffff:7f00:1",
        }
        for value, name in cases.items():
            self.assertEqual(parseHost(value), name, value)

    def test_malformed(self) -> None:
        """Values no client sends for a host: ``None``."""
        for value in (
            b"",
            b"a b",
            b"[::1",
            b"[::1]x",
            b"[::1]:x",
            b"host:port:x",
            b"localhost:abc",
            b"localhost:123456",
            b"::1",
            b"::1:80",
            b"localhost..",
            b".",
            b"127.1",
            b"127.000.0.1",
            b"300.0.0.1",
            b"\xff.example",
            b"[v1.x]",
            b"[fe80::1%25eth0]",
            b"[127.0.0.1]",
            b"a/b",
            b"a@b",
            b"x" * 254,
        ):
            self.assertIsNone(parseHost(value), value)


class HostRuleTests(SynchronousTestCase):
    """Which ``Host`` values ``HostRule`` lets through (protocol §8 and spec §4.1)."""

    def assertAllowed(self, r: HostRule, *values: bytes | None) -> None:
        for value in values:
            self.assertTrue(r.allows(value), value)

    def assertDenied(self, r: HostRule, *values: bytes) -> None:
        for value in values:
            self.assertFalse(r.allows(value), value)

    def test_ipv4(self) -> None:
        """Any 127.0.0.0/8 address, with or without a port; no other address."""
        self.assertAllowed(
            rule(), b"127.0.0.1", b"127.0.0.1:11435", b"127.255.255.254:1", b"127.0.0.1.:80"
        )
        self.assertDenied(
            rule(),
            b"10.0.0.1",
            b"10.0.0.1:11435",
            b"0.0.0.0:11435",
            b"192.168.1.2",
            b"128.0.0.1",
            b"1.2.3.4",
        )

    def test_ipv6(self) -> None:
        """``[::1]`` in any spelling, with or without a port, and IPv4-mapped loopback."""
        self.assertAllowed(
            rule(),
            b"[::1]",
            b"[::1]:11434",
            b"[0:0:0:0:0:0:0:1]:1",
            b"[::ffff:127.0.0.1]",
            b"[::ffff:7f00:1]:80",
        )
        self.assertDenied(
            rule(),
            b"[::2]",
            b"[::]:1",
            b"[fe80::1]",
            b"[::ffff:10.0.0.1]",
            b"[::1%25lo]",
            b"::1",
            b"[::1",
        )

    def test_localhost(self) -> None:
        """``localhost`` and ``*.localhost`` in any case, trailing dot and port allowed."""
        self.assertAllowed(
            rule(),
            b"localhost",
            b"LOCALHOST:1",
            b"localhost.",
            b"api.localhost:8080",
            b"a.b.LocalHost",
            b"x.localhost.",
        )
        self.assertDenied(
            rule(),
            b"localhost.evil.example",
            b"evillocalhost",
            b"localhost.evil.example:11434",
            b"127.0.0.1.nip.io",
        )

    def test_machineName(self) -> None:
        """This machine's host name, case-insensitively; not other names under it."""
        self.assertAllowed(rule(), b"workstation", b"WORKSTATION:11434", b"workstation.")
        self.assertDenied(rule(), b"workstation.evil.example", b"workstation2")

    def test_machineNameFromSystem(self) -> None:
        """Without an explicit name the rule asks the system for it (socket.gethostname)."""
        import socket

        self.patch(socket, "gethostname", lambda: "Box.Example.")
        r = HostRule()
        self.assertAllowed(r, b"box.example:1", b"box.local:1")
        self.assertDenied(r, b"box:1", b"other.local:1")

    def test_localAndInternal(self) -> None:
        """Only this machine's own ``.local`` and ``.internal`` names (spec §4.1, issue 32):
        any other such name can be answered by anyone on the LAN (mDNS) and rebound;
        ``--allowed-hosts '*.local,*.internal'`` restores protocol §8's rule."""
        own = (b"workstation.local", b"Workstation.Internal:11434", b"WORKSTATION.LOCAL.")
        self.assertAllowed(rule(), *own)
        others = (b"printer.local", b"host.docker.internal:1", b"A.LOCAL.", b"x.workstation.local")
        self.assertDenied(rule(), *others, b"workstation.local.evil.example", b"local")
        self.assertDenied(rule(), b"internal", b"evil.localnet", b"evil.internal.example")
        self.assertAllowed(rule("*.local", "*.internal"), *others)
        self.assertDenied(rule("host.docker.internal"), b"printer.local", b"x.docker.internal")

    def test_ownNames(self) -> None:
        """A full host name gives its short name's ``.local`` and ``.internal`` too; no
        host name at all gives none."""
        names = {"box.example", "box.local", "box.internal"}
        names |= {"box.example.local", "box.example.internal"}
        self.assertEqual(ownNames("Box.Example."), names)
        self.assertEqual(ownNames(""), frozenset())
        self.assertDenied(HostRule(hostname=""), b".local", b"local")

    def test_foreign(self) -> None:
        """A rebinding page's own name is refused, whatever its port."""
        self.assertDenied(rule(), b"evil.example", b"evil.example:11434", b"example.com:80")

    def test_allowedHosts(self) -> None:
        """``--allowed-hosts`` names, addresses and ``*.domain`` patterns are allowed too."""
        r = rule("llm.example", "10.0.0.5", "[fd00::1]", "*.corp.example")
        self.assertAllowed(
            r,
            b"llm.example:11434",
            b"LLM.EXAMPLE",
            b"10.0.0.5:1",
            b"[fd00:0::1]:80",
            b"a.corp.example",
            b"a.b.corp.example:1",
        )
        self.assertDenied(
            r, b"corp.example", b"xcorp.example", b"llm.example.evil", b"10.0.0.6", b"evil.example"
        )

    def test_star(self) -> None:
        """``*`` turns the check off: anything passes, malformed values included."""
        r = rule("*")
        self.assertAllowed(r, b"evil.example:1", b"a b", b"", b"[::1")
        self.assertTrue(rule("llm.example", "*").open)

    def test_missingAndMalformed(self) -> None:
        """An absent Host passes (HTTP/1.0 from a loopback peer); empty or malformed ones do not."""
        self.assertAllowed(rule(), None)
        self.assertDenied(
            rule(),
            b"",
            b" ",
            b"a b",
            b"[::1",
            b"host:port:x",
            b"localhost:abc",
            b"localhost..",
            b"localhost\x00",
            b"127.1",
        )

    def test_cacheAnswersRepeats(self) -> None:
        """A repeated value is answered from the cache: decided once."""
        r = _Counting()
        for _ in range(5):
            self.assertTrue(r.allows(b"127.0.0.1:11435"))
            self.assertTrue(r.allows(b"localhost:11435"))
            self.assertFalse(r.allows(b"evil.example:11435"))
        self.assertEqual(r.decided, [b"127.0.0.1:11435", b"localhost:11435", b"evil.example:11435"])

    def test_cacheBounded(self) -> None:
        """Past ``CACHE_SIZE`` values the cache starts over; long values are never kept."""
        r = _Counting()
        r.allows(b"127.0.0.1:1")
        for i in range(CACHE_SIZE):
            r.allows(b"n%d.localhost" % i)
        r.allows(b"127.0.0.1:1")
        self.assertEqual(r.decided.count(b"127.0.0.1:1"), 2)
        long = b"a" * CACHE_KEY_MAX + b".localhost"
        r.allows(long)
        r.allows(long)
        self.assertEqual(r.decided.count(long), 2)


class _Counting(HostRule):
    """A rule that records every value it had to decide (not answered from the cache)."""

    def __init__(self) -> None:
        super().__init__(hostname=HOSTNAME)
        self.decided: list[bytes] = []

    def decide(self, host: bytes) -> bool:
        self.decided.append(host)
        return super().decide(host)


class AllowedHostsOptionTests(SynchronousTestCase):
    """``--allowed-hosts`` / ``NVPAIR_PROXY_ALLOWED_HOSTS`` (protocol §1)."""

    def parse(self, argv: list[str], environ: dict[str, str] | None = None) -> Settings:
        options = Options(environ or {})
        options.parseOptions(argv)
        assert options.settings is not None
        return options.settings

    def test_parse(self) -> None:
        """Entries are normalized (case, brackets, trailing dot), deduplicated, blanks skipped."""
        self.assertEqual(
            parseAllowedHosts(
                " LLM.example , ,llm.example.,[FD00::1],fd00::2,*.Corp.example,10.0.0.5"
            ),
            ("llm.example", "fd00::1", "fd00::2", "*.corp.example", "10.0.0.5"),
        )
        self.assertEqual(parseAllowedHosts(""), ())
        self.assertEqual(parseAllowedHosts("*"), ("*",))

    def test_parseMalformed(self) -> None:
        """An entry with a port, a space, a bad pattern or address is a ValueError naming it."""
        for text in (
            "llm.example:11434",
            "a b",
            "*.",
            "*x.example",
            "[::1]:80",
            "[::1",
            "fe80::1%eth0",
            "127.1",
            "ok.example,bad name",
        ):
            with self.assertRaises(ValueError) as cm:
                parseAllowedHosts(text)
            self.assertIn("not a host name or address", str(cm.exception), text)

    def test_defaultFlagAndEnvironment(self) -> None:
        """Default none; read from the flag or the environment; the flag wins."""
        self.assertEqual(self.parse([]).allowedHosts, ())
        self.assertEqual(
            self.parse(["--allowed-hosts", "a.example,b.example"]).allowedHosts,
            ("a.example", "b.example"),
        )
        env = {"NVPAIR_PROXY_ALLOWED_HOSTS": "*"}
        self.assertEqual(self.parse([], env).allowedHosts, ("*",))
        self.assertEqual(
            self.parse(["--allowed-hosts=c.example"], env).allowedHosts, ("c.example",)
        )

    def test_malformedExits2(self) -> None:
        """A malformed value exits 2 with one stderr line naming the option, nothing on stdout."""
        assertExitsNaming(
            self,
            "--allowed-hosts",
            ((["--allowed-hosts", "a b"], {}), ([], {"NVPAIR_PROXY_ALLOWED_HOSTS": "host:1"})),
        )


class HostGateTests(SynchronousTestCase):
    """A refusal is counted every time and logged once per name, without anything else."""

    def setUp(self) -> None:
        self.counted: list[str] = []
        self.events = Events()
        self.gate = HostGate(rule(), self.counted.append)
        self.gate.log = Logger(observer=self.events)

    def warnings(self) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in e.items() if not k.startswith("log_")}
            | {"event": e["log_format"], "level": e["log_level"].name}
            for e in self.events
        ]

    def test_oncePerName(self) -> None:
        """The same name (any port, any case) is logged once; every refusal is counted."""
        self.gate.refused(b"evil.example:11434", "ollama")
        self.gate.refused(b"EVIL.example:1", "lmstudio")
        self.gate.refused(b"other.example", "ops")
        self.assertEqual(self.counted, ["ollama", "lmstudio", "ops"])
        self.assertEqual(
            self.warnings(),
            [
                {
                    "event": "host-denied",
                    "level": "warn",
                    "engine": "ollama",
                    "host": "evil.example",
                },
                {
                    "event": "host-denied",
                    "level": "warn",
                    "listener": "ops",
                    "host": "other.example",
                },
            ],
        )

    def test_malformedNameShortened(self) -> None:
        """A malformed value is logged as received, cut to ``LOG_NAME_MAX`` characters."""
        self.gate.refused(b"a b" + b"x" * 500, "ollama")
        [event] = self.warnings()
        self.assertEqual(event["host"], "a b" + "x" * (LOG_NAME_MAX - 3))

    def test_loggedSetBounded(self) -> None:
        """Past ``LOGGED_NAMES`` names, one notice says so; later names are only counted."""
        for i in range(LOGGED_NAMES + 50):
            self.gate.refused(b"n%d.example" % i, "ollama")
        events = self.warnings()
        self.assertEqual(len(events), LOGGED_NAMES + 1)
        self.assertEqual(
            events[-1], {"event": "host-denied-log-full", "level": "warn", "names": LOGGED_NAMES}
        )
        self.assertEqual(len(self.counted), LOGGED_NAMES + 50)

    def test_allowsIsTheRule(self) -> None:
        """The gate answers with its rule's verdicts."""
        self.assertTrue(self.gate.allows(b"localhost:1"))
        self.assertFalse(self.gate.allows(b"evil.example"))
