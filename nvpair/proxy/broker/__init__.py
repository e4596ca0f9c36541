"""The broker channel: JSON-RPC framing, the channel on stdio, workload events and node activity."""
