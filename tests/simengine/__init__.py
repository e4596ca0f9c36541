"""Tests of the simulated engine of the testing kit (nvpair.proxy.testing.simengine)."""
