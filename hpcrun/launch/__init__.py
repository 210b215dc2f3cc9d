"""The launch plane: from a run spec and a site config to ranks in a process group.

- :mod:`hpcrun.launch.site`: ``SiteConfig`` and ``load_site`` (``site_configs/*.yaml``).
- :mod:`hpcrun.launch.sbatch`: ``sbatch_args`` (the job's flags) and ``render_sbatch``.
- :mod:`hpcrun.launch.submit`: ``submit_submitit`` and ``submit_sbatch``.
- :mod:`hpcrun.launch.submission`: the submission pipeline (``submit_run``), shared by
  ``hpcrun submit`` and ``hpcrun.submit``; :mod:`hpcrun.launch.sweep_submission`: a sweep's.
- :mod:`hpcrun.launch.env`: ``DistEnv.from_environ`` and ``derive_master_port``.
- :mod:`hpcrun.launch.dist`: ``form_groups``, ``init_process_group``, ``destroy_process_group``,
  ``device_for``.
- :mod:`hpcrun.launch.gpu`: backend choice, collective timeouts, NCCL environment, GPU count.
- :mod:`hpcrun.launch.topology`: which CPU cores sit next to each GPU.
- :mod:`hpcrun.launch.signals`: ``StopFlag``, ``stop_on``, ``signal_number``.
- :mod:`hpcrun.launch.local`: the embedded local backend.

The Slurm client and its parsers live in :mod:`hpcrun.scheduler`.

Submodules are imported on use, so ``import hpcrun.launch`` stays cheap (no torch, no submitit).
"""
