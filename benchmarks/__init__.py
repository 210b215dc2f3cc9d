"""hpcrun benchmarks: speed targets live here, not in timed tests."""
