"""The drill plane: prove a run's recovery contracts at small scale before the long run.

``hpcrun drill``, ``hpcrun drill --restore``, ``hpcrun preflight`` and ``hpcrun canary`` are
built from the modules here; see ``README.md`` in this package and ``docs/recovery.md``. The
package imports nothing heavy at import time: import the module you need
(:mod:`hpcrun.drill.runner`, :mod:`hpcrun.drill.contracts`, ...).
"""

from __future__ import annotations
