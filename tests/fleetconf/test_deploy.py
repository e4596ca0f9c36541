"""The README's deployment: its systemd units run the real command, its example file passes."""

from __future__ import annotations

import os
import re
import shlex

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.fleetfile import loadFleet
from nvpair.proxy.options import Options
from tests.support.cases.optionparse import Capture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
EXAMPLE = os.path.join(ROOT, "demo", "fleet.example.toml")


def readme() -> str:
    """The README's text."""
    with open(README, encoding="utf-8") as f:
        return f.read()


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", readme(), re.S)


def units() -> list[dict[str, list[str]]]:
    """Each systemd unit of the README as ``key -> values`` of its ``[Service]`` section."""
    found = []
    for text in blocks("ini"):
        section = ""
        service: dict[str, list[str]] = {}
        for line in text.splitlines():
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line:
                key, _, value = line.partition("=")
                service.setdefault(key, []).append(value)
        found.append(service)
    return found


class DeployTests(SynchronousTestCase):
    """What the README tells an operator to install is what works."""

    def parse(self, command: str) -> tuple[Options, int | str | None]:
        """Parse a unit's command line with the example file as its fleet file; the
        options and the exit code (None when it did not exit)."""
        argv = shlex.split(command)
        self.assertTrue(argv[0].endswith("/.venv/bin/nvpair-proxy"), argv[0])
        argv = [EXAMPLE if a.endswith("fleet.toml") else a for a in argv[1:]]
        options = Options({})
        Capture(self)
        try:
            options.parseOptions(argv)
        except SystemExit as e:
            return options, e.code
        return options, None

    def test_units(self) -> None:
        """Both units (user and system) start the proxy standalone on one fleet file,
        check that file first, and map ``systemctl reload`` to SIGHUP after a check."""
        found = units()
        self.assertEqual(len(found), 2)
        for unit in found:
            (start,) = unit["ExecStart"]
            (pre,) = unit["ExecStartPre"]
            self.assertEqual(unit["ExecReload"], [pre, "/bin/kill -HUP $MAINPID"])
            fleet = shlex.split(start)[shlex.split(start).index("--fleet") + 1]
            self.assertEqual(shlex.split(pre)[1:], ["--check-fleet", fleet])
            options, code = self.parse(start)
            self.assertIsNone(code)
            assert options.settings is not None
            self.assertTrue(options.settings.standalone)
            self.assertEqual(options.settings.fleetFile, EXAMPLE)
            self.assertEqual(options.settings.engines, ("ollama", "llamacpp"))
            self.assertEqual(self.parse(pre)[1], 0)

    def test_example(self) -> None:
        """The example fleet file is valid, uses every key, and is the one in the README."""
        spec = loadFleet(EXAMPLE)
        self.assertEqual(spec.engines, ("ollama", "llamacpp"))
        self.assertEqual([b.name for b in spec.backends], ["gpu-box", "laptop", "local-llama"])
        self.assertEqual([b.enabled for b in spec.backends], [True, False, True])
        self.assertEqual(spec.backends[2].maxConcurrency, 4)
        with open(EXAMPLE, encoding="utf-8") as f:
            self.assertIn(f.read(), blocks("toml"))
