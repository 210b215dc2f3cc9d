"""hpcrun.runtime.node."""
