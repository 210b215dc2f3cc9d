"""hpcrun.runtime.supervise."""
