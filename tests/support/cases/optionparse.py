"""Parsing a command line as the process does, and asserting that a bad one exits 2 naming
its option (protocol §1)."""

from __future__ import annotations

import io
import sys

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.options import Options
from nvpair.proxy.settings import Settings


class Capture:
    """Swap ``sys.stderr`` and ``sys.stdout`` for buffers during a parse."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.stderr = io.StringIO()
        self.stdout = io.StringIO()
        test.patch(sys, "stderr", self.stderr)
        test.patch(sys, "stdout", self.stdout)


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    """The settings the command line ``argv`` and the environment ``environ`` give."""
    options = Options(environ or {})
    options.parseOptions(argv)
    assert options.settings is not None
    return options.settings


def assertExitsNaming(
    test: SynchronousTestCase,
    option: str,
    cases: tuple[tuple[list[str], dict[str, str]], ...],
) -> None:
    """Each ``(argv, environ)`` exits 2 with one stderr line naming ``option``, nothing on
    stdout."""
    for argv, environ in cases:
        capture = Capture(test)
        with test.assertRaises(SystemExit) as cm:
            parse(argv, environ)
        test.assertEqual(cm.exception.code, 2, (argv, environ))
        lines = capture.stderr.getvalue().splitlines()
        test.assertEqual(len(lines), 1, (argv, environ))
        test.assertIn(option, lines[0])
        test.assertEqual(capture.stdout.getvalue(), "")
