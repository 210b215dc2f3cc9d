"""A Lightning ``Trainer`` under hpcrun: hpcrun owns the ranks, the commits and the preemption.

A ``main(ctx)`` runs a Trainer in three lines::

    from hpcrun.integrations import lightning as hl

    def main(ctx):
        trainer = L.Trainer(max_steps=200, **hl.trainer_kwargs(ctx))
        hl.fit(ctx, trainer, model, train_dataloaders=loader)

What happens, in order:

1. :func:`trainer_kwargs` gives the Trainer hpcrun's gang: a :class:`HpcrunEnvironment`
   (ranks, world size, node rank, master address and port from hpcrun's :class:`DistEnv`) in a
   :class:`HpcrunDDPStrategy`. hpcrun formed the default process group before ``main(ctx)``;
   Lightning's ``_init_dist_connection`` returns early when ``torch.distributed`` is already
   initialised, so DDP reuses it. Lightning's own ``ModelCheckpoint`` is off (hpcrun's spec
   cadence decides when to commit) and the environment is not a ``SLURMEnvironment``, so
   Lightning never installs its SIGUSR1 requeue handler nor calls ``scontrol requeue``.
2. :func:`fit` registers the trainer's whole state (Lightning's checkpoint dict: weights,
   optimizers, schedulers, loop progress, callbacks, stateful loaders) with ``ctx.restore``;
   on a restored run hpcrun loads its newest commit and the Trainer resumes from it through
   :class:`HpcrunCheckpointIO` (``ckpt_path`` names the hpcrun commit).
3. :class:`HpcrunCallback` at train start hands the signals back to hpcrun (Lightning's
   SIGTERM handler runs a broadcast inside a signal handler), then at each optimizer step
   reports the step and loss (``ctx.step_done``) and runs hpcrun's step boundary
   (``ctx.boundary``): the ranks agree on a pending stop and a due checkpoint; a due checkpoint
   is committed, a stop is committed and the Trainer stops (``trainer.should_stop``).
4. At train end, unless stopped, the final state is committed (``ctx.finish``). ``main``
   returns; hpcrun's worker reads ``ctx.stopped`` and the run requeues or succeeds.

Every commit goes through the context's Checkpointer: fenced by the generation, drained to the
shared tier, restorable after a requeue, listed by ``hpcrun ckpt ls``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcrun.errors import CheckpointError, EnvError
from hpcrun.integrations.ddp import bucket_layout_kwargs
from hpcrun.launch.env import DistEnv

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as exc:  # the optional extra
    raise EnvError(f"hpcrun.integrations.lightning needs Lightning, which does not import "
                   f"({exc}); install it with pip install 'hpcrun[lightning]'") from exc

if TYPE_CHECKING:
    from hpcrun.runtime.rank.context import Context

__all__ = ["HpcrunCallback", "HpcrunCheckpointIO", "HpcrunDDPStrategy", "HpcrunEnvironment",
           "LightningState", "fit", "trainer_kwargs"]

STATE_NAME = "lightning"
"""Name of the trainer's state in hpcrun's commits."""
CKPT_SCHEME = "hpcrun:"
"""Prefix of the ``ckpt_path`` that names an hpcrun commit."""


class HpcrunEnvironment(ClusterEnvironment):
    """The gang hpcrun started, as Lightning's cluster environment."""

    def __init__(self, env: DistEnv) -> None:
        super().__init__()
        self._env = env

    @property
    def creates_processes_externally(self) -> bool:
        return True  # hpcrun's agent starts every rank; Lightning must not spawn any

    @property
    def main_address(self) -> str:
        return self._env.master_addr

    @property
    def main_port(self) -> int:
        return self._env.master_port

    @staticmethod
    def detect() -> bool:
        return "HPCRUN_RUN_DIR" in os.environ

    def world_size(self) -> int:
        return self._env.world_size

    def set_world_size(self, size: int) -> None:
        _check_same("world size (num_nodes x devices)", size, self._env.world_size)

    def global_rank(self) -> int:
        return self._env.rank

    def set_global_rank(self, rank: int) -> None:
        _check_same("global rank", rank, self._env.rank)

    def local_rank(self) -> int:
        return self._env.local_rank

    def node_rank(self) -> int:
        return self._env.node_rank


def _check_same(what: str, lightning: int, hpcrun: int) -> None:
    if lightning != hpcrun:
        raise EnvError(f"Lightning computed {what} {lightning} but hpcrun started {hpcrun}; "
                       "build the Trainer with **trainer_kwargs(ctx), which sets num_nodes "
                       "and devices from the gang")


class LightningState:
    """The trainer's whole state as one hpcrun state object (``state_dict`` /
    ``load_state_dict``): Lightning's own checkpoint dict, dumped at each commit."""

    def __init__(self) -> None:
        self.trainer: pl.Trainer | None = None
        self.restored: dict[str, Any] | None = None
        """The checkpoint dict hpcrun loaded (None: a fresh start)."""
        self.pending: dict[str, Any] | None = None
        """A dict handed to ``Trainer.save_checkpoint``, committed as it is."""

    def state_dict(self) -> dict[str, Any]:
        if self.pending is not None:
            return self.pending
        if self.trainer is None or self.trainer.lightning_module is None:
            return {}  # before fit: nothing to template (every leaf is replicated)
        return self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.restored = dict(state)


class HpcrunCheckpointIO(CheckpointIO):
    """Lightning's checkpoint reads and writes, as hpcrun commits.

    ``load_checkpoint`` returns the commit hpcrun restored (``ckpt_path="hpcrun:<id>"``);
    ``save_checkpoint`` (``Trainer.save_checkpoint``, on every rank under
    :class:`HpcrunDDPStrategy`) commits the dict at the current step, collectively;
    ``remove_checkpoint`` leaves retention to hpcrun's ``keep_last``.
    """

    def __init__(self, ctx: Context, state: LightningState) -> None:
        self._ctx = ctx
        self._state = state

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        self._state.pending = checkpoint
        try:
            self._ctx.finish()  # a collective commit of the registered state at ctx.step
        finally:
            self._state.pending = None

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not str(path).startswith(CKPT_SCHEME) or self._state.restored is None:
            raise CheckpointError(
                f"ckpt_path {path!r} is not the commit hpcrun restored; under hpcrun the "
                "Trainer resumes from the run's newest commit: call hl.fit(ctx, trainer, "
                "model) without ckpt_path")
        return self._state.restored

    def remove_checkpoint(self, path: Any) -> None:
        return None


class HpcrunDDPStrategy(DDPStrategy):
    """DDP on hpcrun's process group, whose checkpoint saves run on every rank (an hpcrun
    commit is collective: each rank writes its shard) instead of on rank 0 only."""

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any,
                        storage_options: Any | None = None) -> None:
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)


class HpcrunCallback(Callback):
    """Steps, losses, commits and stops at hpcrun's step boundaries (see the module steps)."""

    def __init__(self, ctx: Context, state: LightningState) -> None:
        self._ctx = ctx
        self.state = state

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.state.trainer = trainer

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning swapped in its signal handlers just before: put hpcrun's back (they only
        # set the stop flag the boundary reads).
        trainer._signal_connector.teardown()
        if self._ctx.boundary():
            trainer.should_stop = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step <= self._ctx.step:
            return  # accumulating gradients: no optimizer step yet
        self._ctx.step_done(loss=_loss_of(outputs))
        if 0 < trainer.max_steps <= trainer.global_step:
            return  # the last step: on_train_end commits
        if self._ctx.boundary():
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._ctx.stopped:
            self._ctx.finish()


def _loss_of(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return None if loss is None else float(loss)


def trainer_kwargs(ctx: Context, *, environ: Mapping[str, str] | None = None,
                   **ddp_kwargs: Any) -> dict[str, Any]:
    """The Trainer arguments that put it on hpcrun's gang.

    Args:
        ctx: the run's context.
        environ: the rank's environment (``os.environ`` when None), read once.
        ddp_kwargs: passed to :class:`HpcrunDDPStrategy` (e.g. ``find_unused_parameters``).

    Returns:
        ``accelerator``, ``devices``, ``num_nodes``, ``strategy``, ``callbacks`` and
        ``enable_checkpointing=False``; add your own callbacks to the list.
    """
    env = DistEnv.from_environ(dict(os.environ if environ is None else environ))
    # under data.contract bitwise, the one bucket layout a resumed run reproduces
    ddp_kwargs = {**bucket_layout_kwargs(ctx.spec.data.contract, ddp_kwargs), **ddp_kwargs}
    state = LightningState()
    strategy = HpcrunDDPStrategy(cluster_environment=HpcrunEnvironment(env),
                                 checkpoint_io=HpcrunCheckpointIO(ctx, state), **ddp_kwargs)
    return {"accelerator": "gpu" if ctx.device.type == "cuda" else "cpu",
            "devices": env.local_world_size, "num_nodes": env.num_nodes,
            "strategy": strategy, "callbacks": [HpcrunCallback(ctx, state)],
            "enable_checkpointing": False}


def fit(ctx: Context, trainer: pl.Trainer, model: pl.LightningModule,
        **fit_kwargs: Any) -> pl.Trainer:
    """``trainer.fit(model, **fit_kwargs)`` resumed from hpcrun's newest commit, if any.

    Raises:
        EnvError: the trainer was not built with :func:`trainer_kwargs`.
        CheckpointError: ``ckpt_path`` was passed (hpcrun chooses what to resume from).
    """
    callbacks: list[Callback] = getattr(trainer, "callbacks", [])  # a property Lightning adds
    callback = next((c for c in callbacks if isinstance(c, HpcrunCallback)), None)
    if callback is None:
        raise EnvError("the Trainer has no HpcrunCallback; build it with "
                       "L.Trainer(**hpcrun.integrations.lightning.trainer_kwargs(ctx), ...)")
    if "ckpt_path" in fit_kwargs:
        raise CheckpointError("hl.fit got ckpt_path; under hpcrun the Trainer resumes from the "
                              "run's newest commit: drop ckpt_path")
    ctx.restore(**{STATE_NAME: callback.state})
    ckpt_path = f"{CKPT_SCHEME}step-{ctx.step}" if callback.state.restored else None
    trainer.fit(model, ckpt_path=ckpt_path, **fit_kwargs)
    return trainer
