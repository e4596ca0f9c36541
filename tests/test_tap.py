"""Unit tests of the service maker's process-wide settings (``tap``)."""

from __future__ import annotations

import gc
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.tap import YOUNG_COLLECTION_THRESHOLD, tuneCollector


class StartupReactor:
    """Records what is scheduled for when the reactor runs."""

    def __init__(self) -> None:
        self.atStart: list[Any] = []

    def callWhenRunning(self, f: Any) -> None:
        self.atStart.append(f)


class CollectorTests(SynchronousTestCase):
    """The cycle collector is tuned for many short-lived objects per request."""

    def setUp(self) -> None:
        threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *threshold)
        self.addCleanup(gc.unfreeze)

    def test_youngThresholdRaised(self) -> None:
        """The first-generation threshold is raised; the older ones are kept."""
        before = gc.get_threshold()
        tuneCollector(StartupReactor())
        self.assertEqual(gc.get_threshold(), (YOUNG_COLLECTION_THRESHOLD, *before[1:]))

    def test_startupObjectsFrozen(self) -> None:
        """Once the reactor runs, everything built at startup leaves the collector's walks."""
        reactor = StartupReactor()
        tuneCollector(reactor)
        self.assertEqual(reactor.atStart, [gc.freeze])
        reactor.atStart[0]()
        self.assertGreater(gc.get_freeze_count(), 0)
