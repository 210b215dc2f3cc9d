"""Exit statuses of ranks and agents, shared by the runtime and the launchers.

A launcher reads an agent's status to decide whether to start the gang again, so the values
live below both (this module imports nothing from hpcrun).
"""

from __future__ import annotations

EXIT_OK = 0
"""Every step finished."""
EXIT_USER_ERROR = 1
"""The run failed (a user error or a fault that is not retried)."""
EXIT_STALE = 3
"""The process's generation was fenced out by a newer incarnation."""
EXIT_PREEMPTED = 75
"""EX_TEMPFAIL: stopped at a step boundary after committing; run again later."""
