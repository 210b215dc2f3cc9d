"""The scheduler seam: hpcrun's Slurm client and the pure parsers of Slurm's outputs.

- :mod:`hpcrun.scheduler.slurm`: ``SlurmClient`` (every Slurm command, through an injected
  ``CommandRunner``), ``Observation``, ``SlurmJobState``, ``PastRun`` and the parsers
  (``parse_squeue``, ``parse_sacct``, ``parse_nodelist``, ...).

The control plane (reconcile, watch, cancel), the launch plane and the runtime all ask Slurm
through this package; it knows nothing of them.
"""
