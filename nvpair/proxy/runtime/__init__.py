"""The process around the proxy: the reactor, the log format and the stderr writer."""
