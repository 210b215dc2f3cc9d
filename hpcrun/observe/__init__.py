"""hpcrun.observe plane."""
