"""Unit tests of the service maker's process-wide settings (``tap``)."""

from __future__ import annotations

import gc
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.tap import freezeStartupObjects


class StartupReactor:
    """Records what is scheduled for when the reactor runs."""

    def __init__(self) -> None:
        self.atStart: list[Any] = []

    def callWhenRunning(self, f: Any) -> None:
        self.atStart.append(f)


class CollectorTests(SynchronousTestCase):
    """The objects built at startup are left out of cycle collections."""

    def setUp(self) -> None:
        self.addCleanup(gc.unfreeze)

    def test_startupObjectsFrozen(self) -> None:
        """Once the reactor runs, everything built at startup leaves the collector's walks."""
        reactor = StartupReactor()
        freezeStartupObjects(reactor)
        self.assertEqual(reactor.atStart, [gc.freeze])
        reactor.atStart[0]()
        self.assertGreater(gc.get_freeze_count(), 0)
