"""What runs in a rank process: the worker, the Context, SDC checks, script mode (README.md)."""
