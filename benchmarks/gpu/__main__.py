"""``python -m benchmarks.gpu``: the device check (:mod:`benchmarks.gpu.check`)."""

from __future__ import annotations

import sys

from benchmarks.gpu.check import main

if __name__ == "__main__":
    sys.exit(main())
