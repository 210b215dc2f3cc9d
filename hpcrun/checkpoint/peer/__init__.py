"""hpcrun.checkpoint.peer."""
