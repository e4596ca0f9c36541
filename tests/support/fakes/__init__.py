"""Fakes several test modules share: a standalone process and its facades, a log observer,
a cluster trust, a raw TCP client."""
