"""hpcrun.launch plane."""
