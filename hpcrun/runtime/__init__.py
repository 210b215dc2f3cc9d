"""hpcrun.runtime plane."""
