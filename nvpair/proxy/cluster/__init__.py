"""The cluster: trust directory and files, pinned mutual TLS, membership and requests from peers."""
