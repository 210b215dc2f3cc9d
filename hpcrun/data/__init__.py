"""hpcrun.data plane."""
