"""Fleet files and followers the fleet-file tests share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.reload import IFleetFollower

ONE = '[[backend]]\nengine = "llamacpp"\nurl = "http://a:1"\nname = "alpha"\n'
TWO = ONE + '[[backend]]\nengine = "llamacpp"\nurl = "http://b:1"\nmax_concurrency = 2\n'
BAD = ONE + "oops = \n"


@implementer(IFleetFollower)
class RecordingFollower:
    """A follower that records every backend set it is told."""

    def __init__(self) -> None:
        self.sets: list[list[str]] = []

    def setBackends(self, backends: Sequence[Backend]) -> None:
        self.sets.append([b.url for b in backends])


class FleetFile:
    """A fleet file on disk that a test rewrites."""

    def __init__(self, test: SynchronousTestCase, text: str) -> None:
        fd, self.path = tempfile.mkstemp(suffix=".toml")
        os.close(fd)
        test.addCleanup(os.remove, self.path)
        self.write(text)

    def write(self, text: str) -> None:
        """Replace the file's content in place."""
        with open(self.path, "w") as f:
            f.write(text)
