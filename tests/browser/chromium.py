"""The headless-Chromium harness of the browser tests: find the binary, load a page, read the DOM.

``runChromium`` loads a URL with virtual time so the page's scripts run, fails on anything the
page logged to its console (script errors, Content-Security-Policy violations), and hands back
the DOM parsed with ``tests.support.dom``.
"""

from __future__ import annotations

import os
import shutil

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from tests.support.dom import Element, parseDom

# Flags from TWISTED-NOTES: headless as root, loopback only, nothing fetched from the internet.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--hide-scrollbars",
    "--window-size=1400,1000",
)
CHROMIUM_TIMEOUT = 60.0
NO_CHROMIUM = (
    "Chromium is not installed (Debian package 'chromium'; .ci/install-chromium.sh installs it)"
)


def chromiumPath() -> str | None:
    """The Chromium binary to use: ``NVPAIR_CHROMIUM`` or the first one on ``PATH``."""
    configured = os.environ.get("NVPAIR_CHROMIUM")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _Browser(ProcessProtocol):
    """Collects Chromium's stdout (the DOM), the page's console lines from its log on stderr
    (script errors and Content-Security-Policy violations land there), and the end of the
    rest of stderr."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.console: list[str] = []
        self._line = bytearray()
        self.ended: defer.Deferred[int | None] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err = (self.err + data)[-4096:]
        self._line += data
        *lines, rest = self._line.split(b"\n")
        self._line = bytearray(rest[-65536:])
        for line in lines:
            if b":CONSOLE" in line and len(self.console) < 100:
                self.console.append(line.decode("utf-8", "replace"))

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


async def runChromium(binary: str, url: str, profile: str, *extra: str) -> Element:
    """Load ``url`` in headless Chromium, let its scripts run (virtual time), and return the
    DOM; fails if the page logged anything to its console.  Bounded in time."""
    browser = _Browser()
    argv = [
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        "--dump-dom",
        *extra,
        url,
    ]
    transport = reactor.spawnProcess(browser, binary, argv, env=dict(os.environ))

    def kill() -> None:
        try:
            transport.signalProcess("KILL")
        except ProcessExitedAlready:
            pass

    killer = reactor.callLater(CHROMIUM_TIMEOUT, kill)
    code = await browser.ended
    if killer.active():
        killer.cancel()
    else:
        raise AssertionError(f"Chromium did not finish within {CHROMIUM_TIMEOUT:.0f} s")
    if code != 0:
        raise AssertionError(f"Chromium exited {code}: {bytes(browser.err[-800:])!r}")
    if browser.console:
        raise AssertionError("the page logged to its console:\n" + "\n".join(browser.console))
    return parseDom(browser.out.decode("utf-8"))
