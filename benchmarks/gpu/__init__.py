"""The GPU device check (``make gpu-check``): see :mod:`benchmarks.gpu.check`."""
