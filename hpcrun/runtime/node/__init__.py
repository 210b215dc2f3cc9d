"""What runs in a node's agent: its ranks, GPUs, log view, liveness, drain, watches (README)."""
