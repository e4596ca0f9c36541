"""``--fleet`` and ``--check-fleet`` (protocol §1, §9): validated at start, exit 0 or 2."""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.options import Options
from tests.support.cases.optionparse import Capture, parse

FLEET = b'[[backend]]\nengine = "llamacpp"\nurl = "http://127.0.0.1:9001"\nname = "a"\n'
BAD = b'[[backend]]\nengine = "llamacpp"\nurl = "http://127.0.0.1:9001"\ncolour = "red"\n'


def fleetFile(test: SynchronousTestCase, data: bytes) -> str:
    """A fleet file holding ``data``, removed after the test."""
    fd, path = tempfile.mkstemp(suffix=".toml")
    os.write(fd, data)
    os.close(fd)
    test.addCleanup(os.remove, path)
    return path


class FleetOptionTests(SynchronousTestCase):
    """``--fleet FILE`` (env ``NVPAIR_PROXY_FLEET``) in place of ``--backend``/``--engines``."""

    def exits(self, argv: list[str], environ: dict[str, str] | None = None) -> str:
        """Parse, expecting exit 2 with one stderr line and no stdout; return the line."""
        capture = Capture(self)
        with self.assertRaises(SystemExit) as cm:
            parse(argv, environ)
        self.assertEqual(cm.exception.code, 2)
        lines = capture.stderr.getvalue().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(capture.stdout.getvalue(), "")
        return lines[0]

    def test_fleet(self) -> None:
        """A valid file sets the absolute path and the facades it names."""
        path = fleetFile(self, FLEET)
        settings = parse(["--standalone", "--fleet", path])
        self.assertEqual(settings.fleetFile, os.path.abspath(path))
        self.assertEqual(settings.engines, ("llamacpp",))
        self.assertEqual(settings.backends, ())

    def test_environment(self) -> None:
        """``NVPAIR_PROXY_FLEET`` stands in for the flag in standalone mode, and only there."""
        path = fleetFile(self, FLEET)
        settings = parse(["--standalone"], {"NVPAIR_PROXY_FLEET": path})
        self.assertEqual(settings.fleetFile, path)
        self.assertIsNone(parse([], {"NVPAIR_PROXY_FLEET": path}).fleetFile)

    def test_malformed(self) -> None:
        """A bad file exits 2 with one line naming the file, the line and the problem."""
        path = fleetFile(self, BAD)
        line = self.exits(["--standalone", "--fleet", path])
        self.assertIn(f"{path}:4: unknown key 'colour'", line)
        line = self.exits(["--standalone"], {"NVPAIR_PROXY_FLEET": path})
        self.assertIn("NVPAIR_PROXY_FLEET", line)
        self.assertIn(f"{path}:4:", line)

    def test_missing(self) -> None:
        """A file that cannot be read exits 2 naming it."""
        line = self.exits(["--standalone", "--fleet", "/nonexistent/f.toml"])
        self.assertIn("/nonexistent/f.toml: cannot read", line)

    def test_exclusive(self) -> None:
        """``--backend`` or ``--engines`` with a fleet file exits 2."""
        path = fleetFile(self, FLEET)
        for extra in (["--backend", "ollama=http://a:1"], ["--engines", "ollama"]):
            line = self.exits(["--standalone", "--fleet", path, *extra])
            self.assertIn("may not be given with a fleet file", line)
            line = self.exits(["--standalone", *extra], {"NVPAIR_PROXY_FLEET": path})
            self.assertIn("may not be given", line)

    def test_brokerMode(self) -> None:
        """``--fleet`` without ``--standalone`` exits 2 (a broker gives the fleet)."""
        line = self.exits(["--fleet", fleetFile(self, FLEET)])
        self.assertIn("only meaningful with --standalone", line)


class CheckFleetTests(SynchronousTestCase):
    """``--check-fleet FILE`` validates and exits, starting nothing."""

    def check(self, data: bytes) -> tuple[int | str | None, str, str, str]:
        """Run ``--check-fleet`` on ``data``: exit code, stdout, stderr, the path."""
        path = fleetFile(self, data)
        capture = Capture(self)
        options = Options({})
        with self.assertRaises(SystemExit) as cm:
            options.parseOptions(["--check-fleet", path])
        self.assertIsNone(options.settings)  # nothing was configured, nothing starts
        return cm.exception.code, capture.stdout.getvalue(), capture.stderr.getvalue(), path

    def test_valid(self) -> None:
        """A valid file: exit 0 and one summary line on stdout."""
        code, out, err, path = self.check(FLEET)
        self.assertEqual(code, 0)
        self.assertEqual(out, f"{path}: fleet OK: llamacpp: 1 backend\n")
        self.assertEqual(err, "")

    def test_invalid(self) -> None:
        """An invalid file: exit 2 and its one line on stderr."""
        code, out, err, path = self.check(BAD)
        self.assertEqual(code, 2)
        self.assertEqual(out, "")
        self.assertEqual(
            err,
            f"nvpair-proxy: --check-fleet: {path}:4: unknown key 'colour' "
            "in [[backend]] (allowed: engine, url, name, max_concurrency, enabled, preload, "
            "unload_idle)\n",
        )
