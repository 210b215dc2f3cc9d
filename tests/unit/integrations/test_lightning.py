"""hpcrun.integrations.lightning with a real Trainer on one process (gloo, CPU) and a
recording context: the environment Lightning sees, the process group it reuses, the signal
handlers it leaves alone, and the order of steps, boundaries, stops and commits."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("lightning", reason="pip install 'lightning>=2.4,<2.7'")

import lightning.pytorch as pl
import torch
import torch.distributed as dist

from examples.lightning.model import Regressor, SeededBatches, synthetic_data
from hpcrun.control.spec import DataSpec
from hpcrun.errors import CheckpointError, EnvError, SpecError
from hpcrun.integrations import lightning as hl
from hpcrun.launch.env import DistEnv
from hpcrun.vocab import ResumeContract


@dataclass
class RecordingContext:
    """The context calls the integration makes, answering ``stop_after`` boundaries."""

    stop_at: int | None = None
    step: int = 0
    stopped: bool = False
    restored: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    calls: list[tuple[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    handlers: list[Any] = field(default_factory=list)
    spec: Any = field(default_factory=lambda: SimpleNamespace(data=DataSpec()))

    def restore(self, **state: Any) -> int:
        self.state = state
        if self.restored is not None:
            state[hl.STATE_NAME].load_state_dict(self.restored)
            self.step = int(self.restored["global_step"])
        self.calls.append(("restore", self.step))
        return self.step

    def step_done(self, *, loss: float | None = None) -> None:
        self.step += 1
        self.calls.append(("step", self.step))
        assert loss is not None and loss > 0

    def boundary(self) -> bool:
        self.handlers.append(signal.getsignal(signal.SIGTERM))
        self.calls.append(("boundary", self.step))
        if self.stop_at is not None and self.step >= self.stop_at:
            self.calls.append(("commit", self.state[hl.STATE_NAME].state_dict()["global_step"]))
            self.stopped = True
            return True
        return False

    def finish(self) -> None:
        self.calls.append(("commit", self.state[hl.STATE_NAME].state_dict()["global_step"]))


@pytest.fixture()
def group(tmp_path: Path) -> Iterator[Any]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    yield dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()


def _env() -> dict[str, str]:
    return DistEnv.single(job_id="unit", master_port=29555).to_environ()


def test_a_bitwise_run_gets_ddp_with_one_bucket_layout() -> None:
    ctx = RecordingContext()
    strategy = hl.trainer_kwargs(ctx, environ=_env())["strategy"]  # type: ignore[arg-type]
    assert "find_unused_parameters" not in strategy._ddp_kwargs  # torch's defaults
    ctx.spec = SimpleNamespace(data=DataSpec(contract=ResumeContract.BITWISE))
    strategy = hl.trainer_kwargs(ctx, environ=_env())["strategy"]  # type: ignore[arg-type]
    assert strategy._ddp_kwargs["find_unused_parameters"] is True
    assert strategy._ddp_kwargs["static_graph"] is False
    with pytest.raises(SpecError, match="static_graph"):
        hl.trainer_kwargs(ctx, environ=_env(), static_graph=True)  # type: ignore[arg-type]


def _fit(ctx: RecordingContext, steps: int) -> tuple[pl.Trainer, Regressor]:
    torch.manual_seed(0)
    x, y = synthetic_data(seed=0, samples=64, features=8)
    model = Regressor()
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         **hl.trainer_kwargs(ctx, environ=_env()))  # type: ignore[arg-type]
    hl.fit(ctx, trainer, model, train_dataloaders=SeededBatches(  # type: ignore[arg-type]
        x, y, batch_size=8, seed=0))
    return trainer, model


def test_environment_is_hpcruns_gang() -> None:
    env = DistEnv.from_environ({**_env(), "HPCRUN_RANK": "3", "HPCRUN_WORLD_SIZE": "4",
                                "HPCRUN_LOCAL_RANK": "1", "HPCRUN_LOCAL_WORLD_SIZE": "2",
                                "HPCRUN_NODE_RANK": "1", "HPCRUN_NUM_NODES": "2",
                                "HPCRUN_NODES": "n0,n1", "HPCRUN_MASTER_ADDR": "n0"})
    ce = hl.HpcrunEnvironment(env)
    assert (ce.global_rank(), ce.world_size(), ce.local_rank(), ce.node_rank()) == (3, 4, 1, 1)
    assert (ce.main_address, ce.main_port, ce.creates_processes_externally) == (
        "n0", env.master_port, True)
    ce.set_world_size(4)
    with pytest.raises(EnvError, match=r"world size .* 8 but hpcrun started 4.*trainer_kwargs"):
        ce.set_world_size(8)


def test_trainer_reuses_the_group_keeps_hpcruns_signals_and_commits_at_the_end(
        group: Any) -> None:
    ours = signal.getsignal(signal.SIGTERM)
    ctx = RecordingContext()
    trainer, _ = _fit(ctx, steps=5)
    assert dist.distributed_c10d._get_default_group() is group  # not re-initialised
    assert trainer.world_size == 1 and trainer.global_step == 5
    # during training SIGTERM is hpcrun's handler, not Lightning's broadcasting one
    assert ctx.handlers and all(h is ours for h in ctx.handlers)
    assert ctx.calls == [("restore", 0), ("boundary", 0)] + [
        c for s in range(1, 5) for c in (("step", s), ("boundary", s))] + [
        ("step", 5), ("commit", 5)]


def test_a_stop_commits_at_the_boundary_and_ends_fit(group: Any) -> None:
    ctx = RecordingContext(stop_at=3)
    trainer, _ = _fit(ctx, steps=10)
    assert trainer.global_step == 3 and ctx.stopped
    assert ctx.calls[-2:] == [("boundary", 3), ("commit", 3)]  # no final commit after a stop


def test_resume_from_a_commit_ends_with_the_uninterrupted_weights(group: Any) -> None:
    _, whole = _fit(RecordingContext(), steps=12)
    first = RecordingContext(stop_at=5)
    _fit(first, steps=12)
    commit = first.state[hl.STATE_NAME].state_dict()
    resumed = RecordingContext(restored=commit)
    trainer, model = _fit(resumed, steps=12)
    assert resumed.calls[:2] == [("restore", 5), ("boundary", 5)]
    assert trainer.global_step == 12
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name


def test_fit_refuses_a_trainer_without_hpcrun_and_a_ckpt_path(group: Any) -> None:
    ctx = RecordingContext()
    with pytest.raises(EnvError, match="trainer_kwargs"):
        hl.fit(ctx, pl.Trainer(logger=False), Regressor())  # type: ignore[arg-type]
    trainer = pl.Trainer(logger=False, **hl.trainer_kwargs(ctx, environ=_env()))  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="drop ckpt_path"):
        hl.fit(ctx, trainer, Regressor(), ckpt_path="last.ckpt")  # type: ignore[arg-type]


class SavesMidway(pl.Callback):
    """Calls ``trainer.save_checkpoint`` once, after step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at:
            trainer.save_checkpoint("ignored.ckpt")


def test_trainer_save_checkpoint_is_a_commit_at_the_current_step(group: Any,
                                                                 tmp_path: Path) -> None:
    ctx = RecordingContext()
    kw = hl.trainer_kwargs(ctx, environ=_env())  # type: ignore[arg-type]
    kw["callbacks"].append(SavesMidway(at=2))
    x, y = synthetic_data(seed=0, samples=64, features=8)
    trainer = pl.Trainer(max_steps=4, logger=False, enable_progress_bar=False,
                         default_root_dir=tmp_path, use_distributed_sampler=False, **kw)
    hl.fit(ctx, trainer, Regressor(), train_dataloaders=SeededBatches(  # type: ignore[arg-type]
        x, y, batch_size=8, seed=0))
    assert [c for c in ctx.calls if c[0] == "commit"] == [("commit", 2), ("commit", 4)]
    assert not list(tmp_path.rglob("*.ckpt"))  # no file of Lightning's own


def test_checkpoint_io_loads_only_the_commit_hpcrun_restored() -> None:
    state = hl.LightningState()
    io = hl.HpcrunCheckpointIO(RecordingContext(), state)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="not the commit hpcrun restored"):
        io.load_checkpoint("hpcrun:step-3")
    state.load_state_dict({"global_step": 3})
    assert io.load_checkpoint("hpcrun:step-3") == {"global_step": 3}
    with pytest.raises(CheckpointError, match="without ckpt_path"):
        io.load_checkpoint("/tmp/last.ckpt")


def test_inside_a_slurm_step_lightning_neither_takes_the_environment_nor_sigusr1(
        group: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                        "SLURM_NODEID": "0", "SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "train",
                        "SLURM_NODELIST": "n0"}.items():
        monkeypatch.setenv(name, value)
    before = signal.getsignal(signal.SIGUSR1)
    seen: list[Any] = []

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            seen.append((type(trainer._accelerator_connector.cluster_environment),
                         signal.getsignal(signal.SIGUSR1)))

    ctx = RecordingContext()
    kw = hl.trainer_kwargs(ctx, environ=_env())  # type: ignore[arg-type]
    kw["callbacks"].append(Probe())
    x, y = synthetic_data(seed=0, samples=64, features=8)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False,
                         use_distributed_sampler=False, **kw)
    hl.fit(ctx, trainer, Regressor(), train_dataloaders=SeededBatches(  # type: ignore[arg-type]
        x, y, batch_size=8, seed=0))
    assert seen == [(hl.HpcrunEnvironment, before)] * 2


def test_without_lightning_the_import_names_the_extra() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['lightning'] = None\n"
            "try:\n    import hpcrun.integrations.lightning\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.startswith("EnvError hpcrun.integrations.lightning needs Lightning")
    assert "pip install 'hpcrun[lightning]'" in done.stdout
