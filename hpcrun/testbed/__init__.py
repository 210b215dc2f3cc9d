"""hpcrun.testbed plane."""
