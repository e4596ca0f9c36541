"""Test cases and helpers several test modules share: the request path's and the fake
engine's integration cases, the queue's and the spans' unit cases, and the command line,
the metrics text and the fleet file text those tests write and read."""
