"""The fleet file's ``share_prefixes`` (protocol §9: prefix scopes "unless the fleet file
shares them"; spec §11 "Scopes"): parsed, validated, and followed on reload."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.fleetfile import FleetError, parseFleet
from nvpair.proxy.facade.reload import findReloader
from nvpair.proxy.facade.standalone import startStandalone
from tests.fleetconf.filekit import ONE, FleetFile
from tests.support.fakes.standalone import FakeService

PATH = "/etc/nvpair/fleet.toml"


class ParseTests(SynchronousTestCase):
    """``share_prefixes`` is a top-level boolean, false by default."""

    def test_values(self) -> None:
        """Absent: false; ``true`` and ``false`` as written."""
        self.assertFalse(parseFleet(ONE.encode(), PATH).sharePrefixes)
        shared = parseFleet(b"share_prefixes = true\n" + ONE.encode(), PATH)
        self.assertTrue(shared.sharePrefixes)
        self.assertFalse(parseFleet(b"share_prefixes = false\n" + ONE.encode(), PATH).sharePrefixes)

    def test_notABoolean(self) -> None:
        """Anything but a boolean is refused on its line."""
        for value in ('"yes"', "1", "[true]"):
            with self.assertRaises(FleetError) as caught:
                parseFleet(f"engines = ['llamacpp']\nshare_prefixes = {value}\n".encode(), PATH)
            self.assertEqual(caught.exception.line, 2)
            self.assertIn("share_prefixes must be true or false", caught.exception.problem)


class FollowTests(SynchronousTestCase):
    """Standalone mode reads the option of the fleet in force at each admission."""

    def test_reloadSwitches(self) -> None:
        """Off at start, on after a reload that sets it, off again after one that drops it;
        without a fleet file, never."""
        file = FleetFile(self, ONE)
        process = FakeService(("llamacpp",), (), fleetFile=file.path, affinity="prefix")
        startStandalone(process)
        process.startService()
        self.addCleanup(process.stopService)
        reloader = findReloader(process)
        affinity = process.context.affinity
        assert reloader is not None and affinity is not None
        self.assertFalse(affinity.sharesPrefixes())
        file.write("share_prefixes = true\n" + ONE)
        reloader.reload("signal")
        self.assertTrue(affinity.sharesPrefixes())
        file.write(ONE)
        reloader.reload("signal")
        self.assertFalse(affinity.sharesPrefixes())
        plain = FakeService(("llamacpp",), (), affinity="prefix")
        startStandalone(plain)
        assert plain.context.affinity is not None
        self.assertFalse(plain.context.affinity.sharesPrefixes())
