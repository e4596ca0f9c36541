"""Unit tests for nvpair.proxy.facade.fleetfile: the fleet file's contract (protocol §9)."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.fleetfile import (
    MAX_BACKENDS,
    MAX_FILE_BYTES,
    Backend,
    FleetError,
    FleetSpec,
    loadFleet,
    parseFleet,
)
from tests.support.cases.fleettext import tomlValue

PATH = "/etc/nvpair/fleet.toml"

GOOD = b"""\
engines = ["ollama", "llamacpp"]

[[backend]]
engine = "ollama"
url = "http://192.168.1.20:11434/"
name = "gpu-box"
max_concurrency = 4

[[backend]]
engine = "ollama"
url = "http://192.168.1.21:11434"
enabled = false
"""


def parse(text: str) -> FleetSpec:
    """Parse ``text`` as the file at ``PATH``."""
    return parseFleet(text.encode("utf-8"), PATH)


class ValidFleetTests(SynchronousTestCase):
    """What a valid file means."""

    def test_contract(self) -> None:
        """Every key of protocol §9 is read; URLs are normalised as ``--backend`` does."""
        spec = parseFleet(GOOD, PATH)
        self.assertEqual(spec.engines, ("ollama", "llamacpp"))
        self.assertEqual(
            spec.backends,
            (
                Backend("ollama", "http://192.168.1.20:11434", "gpu-box", 4, True),
                Backend("ollama", "http://192.168.1.21:11434", None, None, False),
            ),
        )

    def test_serving(self) -> None:
        """Disabled backends serve nothing; an engine with no entry gets its default node."""
        spec = parseFleet(GOOD, PATH)
        self.assertEqual([b.url for b in spec.serving("ollama")], ["http://192.168.1.20:11434"])
        self.assertEqual([b.url for b in spec.serving("llamacpp")], ["http://127.0.0.1:8081"])

    def test_allDisabled(self) -> None:
        """An engine whose every entry is disabled has no node (not its default)."""
        spec = parse('[[backend]]\nengine = "lmstudio"\nurl = "http://a:1"\nenabled = false\n')
        self.assertEqual(spec.engines, ("lmstudio",))
        self.assertEqual(spec.serving("lmstudio"), ())

    def test_enginesDefault(self) -> None:
        """Without ``engines`` the facades are those with a backend, in file order."""
        spec = parse(
            '[[backend]]\nengine = "llamacpp"\nurl = "http://a:1"\n'
            '[[backend]]\nengine = "ollama"\nurl = "http://b:1"\n'
        )
        self.assertEqual(spec.engines, ("llamacpp", "ollama"))

    def test_enginesOnly(self) -> None:
        """``engines`` alone is a fleet of default backends."""
        spec = parse('engines = ["lmstudio"]\n')
        self.assertEqual([b.url for b in spec.serving("lmstudio")], ["http://127.0.0.1:1235"])

    def test_summary(self) -> None:
        """The ``--check-fleet`` line counts what would serve."""
        self.assertEqual(
            parseFleet(GOOD, PATH).summary(),
            "fleet OK: ollama: 1 backend, llamacpp: 1 backend (1 disabled)",
        )

    def test_loadFile(self) -> None:
        """``loadFleet`` reads the file it names."""
        fd, path = tempfile.mkstemp(suffix=".toml")
        self.addCleanup(os.remove, path)
        os.write(fd, GOOD)
        os.close(fd)
        self.assertEqual(loadFleet(path), parseFleet(GOOD, path))


class BadFleetTests(SynchronousTestCase):
    """Every kind of bad file is one ``FleetError``: file, line and problem."""

    def refused(self, text: str, line: int, words: str) -> None:
        """Assert ``text`` is refused at ``line`` with ``words`` in the problem."""
        with self.assertRaises(FleetError) as caught:
            parse(text)
        e = caught.exception
        self.assertEqual((e.path, e.line), (PATH, line), str(e))
        self.assertIn(words, e.problem)
        self.assertTrue(str(e).startswith(f"{PATH}:{line}: "))
        self.assertNotIn("\n", str(e))

    def test_syntax(self) -> None:
        """A TOML syntax error carries tomllib's line."""
        self.refused('[[backend]]\nengine = "ollama"\nurl = http://x\n', 3, "invalid TOML")

    def test_syntaxAtEnd(self) -> None:
        """An error at the end of the document names the last line."""
        self.refused('engines = ["ollama"\n', 1, "invalid TOML")

    def test_notUtf8(self) -> None:
        """Bytes that are not UTF-8 name the line they are on."""
        with self.assertRaises(FleetError) as caught:
            parseFleet(b'engines = ["ollama"]\n# \xff\n', PATH)
        self.assertEqual(caught.exception.line, 2)

    def test_tooLarge(self) -> None:
        """A file over the size bound is refused before parsing."""
        with self.assertRaises(FleetError) as caught:
            parseFleet(b"#" * (MAX_FILE_BYTES + 1), PATH)
        self.assertIn("larger than", caught.exception.problem)

    def test_tooManyBackends(self) -> None:
        """More backends than the bound is an error naming the first one over it."""
        text = "".join(
            f'[[backend]]\nengine = "ollama"\nurl = "http://h{i}:1"\n'
            for i in range(MAX_BACKENDS + 1)
        )
        self.refused(text, 3 * MAX_BACKENDS + 1, f"more than {MAX_BACKENDS}")

    def test_unknownTopKey(self) -> None:
        """An unknown top-level key is an error on its line, not ignored."""
        self.refused('engines = ["ollama"]\npoll = 3\n', 2, "unknown key 'poll'")

    def test_unknownTable(self) -> None:
        """An unknown table is an unknown key."""
        self.refused('engines = ["ollama"]\n\n[server]\nport = 1\n', 1, "unknown key 'server'")

    def test_unknownBackendKey(self) -> None:
        """An unknown key in a backend is an error on its own line."""
        self.refused(
            '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\nweight = 2\n', 4, "'weight'"
        )

    def test_missingKeys(self) -> None:
        """A backend without engine or url names its table's header line."""
        self.refused(
            '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\n\n'
            '[[backend]]\nengine = "ollama"\n',
            5,
            "no url",
        )
        self.refused('[[backend]]\nurl = "http://a:1"\n', 1, "no engine")

    def test_unknownEngine(self) -> None:
        """An engine that is not one of the three is refused on its line."""
        self.refused('[[backend]]\nurl = "http://a:1"\nengine = "vllm"\n', 3, "unknown engine")
        self.refused('engines = ["ollama", "vllm"]\n', 1, "unknown engine 'vllm'")

    def test_wrongTypes(self) -> None:
        """Each key has one type: strings, an integer (not a boolean), a boolean."""
        base = '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\n'
        self.refused(base + "name = 3\n", 4, "name must be a string")
        self.refused(base + "max_concurrency = true\n", 4, "must be an integer")
        self.refused(base + 'max_concurrency = "4"\n', 4, "must be an integer")
        self.refused(base + 'enabled = "no"\n', 4, "true or false")
        self.refused('[[backend]]\nengine = 1\nurl = "http://a:1"\n', 2, "must be a string")
        self.refused('engines = "ollama"\n', 1, "list of engine names")
        self.refused("backend = 3\n", 1, "array of [[backend]] tables")
        self.refused("backend = [1]\n", 1, "must be a table")

    def test_ranges(self) -> None:
        """max_concurrency and name are bounded."""
        base = '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\n'
        self.refused(base + "max_concurrency = 0\n", 4, "max_concurrency must be 1 to")
        self.refused(base + "max_concurrency = 100000\n", 4, "max_concurrency must be 1 to")
        self.refused(base + 'name = ""\n', 4, "printable")
        self.refused(base + f'name = "{"x" * 65}"\n', 4, "printable")
        self.refused(base + 'name = "a\\u0007b"\n', 4, "printable")

    def test_residencyKeys(self) -> None:
        """``preload`` (model names, each once) and ``unload_idle`` (a boolean) per backend
        (protocol §9); bad values refused on their line."""
        base = '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\n'
        spec = parse(base + 'preload = ["qwen3:8b", "gemma3"]\nunload_idle = true\n')
        backend = spec.backends[0]
        self.assertEqual((backend.preload, backend.unloadIdle), (("qwen3:8b", "gemma3"), True))
        self.assertEqual((parse(base).backends[0].preload, parse(base).backends[0].unloadIdle),
                         ((), False))  # fmt: skip
        self.refused(base + 'preload = "qwen"\n', 4, "list of model names")
        self.refused(base + "preload = [1]\n", 4, "list of model names")
        self.refused(base + 'preload = ["a", "a"]\n', 4, "twice")
        self.refused(base + 'preload = [""]\n', 4, "printable")
        many = ", ".join(f'"m{i}"' for i in range(65))
        self.refused(base + f"preload = [{many}]\n", 4, "more than 64")
        self.refused(base + 'unload_idle = "yes"\n', 4, "true or false")

    def test_badUrls(self) -> None:
        """Only plain http URLs with a host and no credentials, query or fragment."""
        for url, words in [
            ("https://a:1", "http://"),
            ("ftp://a", "http://"),
            ("a:1", "http://"),
            ("http://", "no host"),
            ("http://u:p@a:1", "credentials"),
            ("http://a:1/?x=1", "query"),
            ("http://a:1#f", "query or fragment"),
            ("http://a:99999", "not a valid URL"),
            ("http://a:0", "port 0"),
        ]:
            self.refused(f'[[backend]]\nengine = "ollama"\n\nurl = "{url}"\n', 4, words)

    def test_duplicateUrl(self) -> None:
        """The same node twice (after normalisation) names the second's url line."""
        self.refused(
            '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\n'
            '[[backend]]\nengine = "llamacpp"\nurl = "http://a:1/"\n',
            6,
            "duplicate url 'http://a:1' (already backend #1)",
        )

    def test_duplicateName(self) -> None:
        """Two backends with one name cannot be told apart on the page."""
        self.refused(
            '[[backend]]\nengine = "ollama"\nurl = "http://a:1"\nname = "x"\n'
            '[[backend]]\nengine = "ollama"\nurl = "http://b:1"\nname = "x"\n',
            8,
            "duplicate name",
        )

    def test_engineNotListed(self) -> None:
        """A backend of an engine left out of ``engines`` contradicts it."""
        self.refused(
            'engines = ["ollama"]\n[[backend]]\nengine = "llamacpp"\nurl = "http://a:1"\n',
            3,
            "not in the top-level engines list",
        )

    def test_enginesBad(self) -> None:
        """An empty or repeating ``engines`` list is refused."""
        self.refused("engines = []\n", 1, "engines is empty")
        self.refused('engines = ["ollama", "ollama"]\n', 1, "twice")

    def test_empty(self) -> None:
        """A file with no backend and no engines is an empty fleet."""
        self.refused("# nothing\n", 1, "empty fleet")
        self.refused("", 1, "empty fleet")

    def test_inlineTables(self) -> None:
        """Backends written as an inline array still get a line (the array's)."""
        self.refused(
            'engines = ["ollama"]\nbackend = [{engine = "ollama", url = "ftp://a"}]\n',
            2,
            "http://",
        )

    def test_unreadable(self) -> None:
        """A missing file is an error naming it (there is no line to name)."""
        with self.assertRaises(FleetError) as caught:
            loadFleet("/nonexistent/fleet.toml")
        self.assertTrue(str(caught.exception).startswith("/nonexistent/fleet.toml: cannot read"))


_KEYS = st.sampled_from(
    [
        "engine",
        "url",
        "name",
        "max_concurrency",
        "enabled",
        "engines",
        "x",
        "preload",
        "unload_idle",
    ]
)
_VALUES = st.one_of(
    st.integers(-5, 5000),
    st.booleans(),
    st.sampled_from(["ollama", "llamacpp", "lmstudio", "http://a:1", "http://b:2/", "ftp://x"]),
    st.text(max_size=10),
    st.lists(st.sampled_from(["ollama", "lmstudio", "vllm"]), max_size=3),
)


@st.composite
def fleetTexts(draw: st.DrawFn) -> str:
    """Plausible fleet files: top keys, then backend tables of random keys and values."""
    lines = [f"{k} = {tomlValue(draw(_VALUES))}" for k in draw(st.lists(_KEYS, max_size=2))]
    for _ in range(draw(st.integers(0, 4))):
        lines.append("[[backend]]")
        lines += [f"{k} = {tomlValue(draw(_VALUES))}" for k in draw(st.lists(_KEYS, max_size=5))]
    return "\n".join(lines) + "\n"


class FleetPropertyTests(SynchronousTestCase):
    """The parser never crashes: a valid fleet or a ``FleetError`` with a line."""

    def check(self, data: bytes) -> None:
        """Parse ``data``; any outcome but a spec or a located error fails."""
        try:
            spec = parseFleet(data, PATH)
        except FleetError as e:
            self.assertGreaterEqual(e.line, 1)
            self.assertLessEqual(e.line, max(1, data.count(b"\n") + 1))
            self.assertNotIn("\n", str(e))
            return
        self.assertTrue(spec.engines)
        urls = [b.url for b in spec.backends]
        self.assertEqual(len(urls), len(set(urls)))

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=300))
    def test_arbitraryBytes(self, data: bytes) -> None:
        """Arbitrary bytes are parsed or refused with a line."""
        self.check(data)

    @settings(max_examples=500, deadline=None)
    @given(fleetTexts())
    def test_arbitraryFleets(self, text: str) -> None:
        """Arbitrary TOML of fleet-like keys is parsed or refused with a line."""
        self.check(text.encode("utf-8"))
