"""Operations: the ops listener, /metrics, /status, traffic history, node state and the ops page."""
