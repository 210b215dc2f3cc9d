"""The supervising agent: gather, decide (pure), carry out; takeover (README.md)."""
