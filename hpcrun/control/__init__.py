"""hpcrun.control plane."""
