"""hpcrun.runtime.rank."""
