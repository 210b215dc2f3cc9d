"""hpcrun.checkpoint plane."""
