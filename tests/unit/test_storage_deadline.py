"""Shared-tier operations under a deadline, and drill faults injected at the storage seam."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.errors import SpecError, StorageError, StorageTimeoutError
from hpcrun.launch.striping import SharedTierConfig, apply_striping, stripe_command
from hpcrun.runner import CommandResult
from hpcrun.runtime.sharedtier import parse_storage_injection, shared_tier_storage
from hpcrun.storage import LOCAL_STORAGE, DeadlineStorage, FaultyStorage


def _release(fifo: Path) -> None:
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(writer)


def test_an_operation_blocked_in_the_kernel_times_out_within_the_deadline(
        tmp_path: Path) -> None:
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    stalled = FaultyStorage(LOCAL_STORAGE, mode="stall", while_path=str(fifo), ops=("rename",))
    storage = DeadlineStorage(stalled, deadline_s=0.3)
    (tmp_path / "a").write_bytes(b"x")
    started = time.monotonic()
    with pytest.raises(StorageTimeoutError, match=r"rename .* did not finish within its 0.3 s "
                       "deadline"):
        storage.rename(tmp_path / "a", tmp_path / "b")
    assert time.monotonic() - started < 2.0
    storage.write_atomic(tmp_path / "c", b"other ops pass")  # not in ops: not stalled
    assert (tmp_path / "c").read_bytes() == b"other ops pass"
    _release(fifo)  # the tier answers: the blocked rename completes in its own thread
    deadline = time.monotonic() + 5
    while not (tmp_path / "b").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "b").read_bytes() == b"x"


def test_blocked_operations_are_bounded_then_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    stuck: set[threading.Thread] = set()
    seen: list[str] = []
    stalled = FaultyStorage(LOCAL_STORAGE, mode="stall", while_path=str(fifo))
    for _ in range(2):  # a new wrapper per round shares the stuck set
        with pytest.raises(StorageTimeoutError):
            DeadlineStorage(stalled, deadline_s=0.1, max_stuck=2, stuck=stuck,
                            on_timeout=seen.append).makedirs(tmp_path / "d")
    started = time.monotonic()
    with pytest.raises(StorageTimeoutError, match="2 earlier storage operations are still "
                       "blocked"):
        DeadlineStorage(stalled, deadline_s=5, max_stuck=2, stuck=stuck,
                        on_timeout=seen.append).makedirs(tmp_path / "d")
    assert time.monotonic() - started < 1.0 and len(seen) == 3
    _release(fifo)


def test_errors_of_the_inner_storage_pass_through(tmp_path: Path) -> None:
    flag = tmp_path / "down"
    failing = FaultyStorage(LOCAL_STORAGE, mode="fail", while_path=str(flag))
    storage = DeadlineStorage(failing, deadline_s=5)
    storage.makedirs(tmp_path / "ok")
    flag.touch()
    with pytest.raises(StorageError, match="injected while") as info:
        storage.makedirs(tmp_path / "nope")
    assert not isinstance(info.value, StorageTimeoutError)


def test_a_timeout_is_recorded_as_a_background_storage_timeout_fault(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, RunSpec.from_dict({"name": "t", "entrypoint": "m:f"}),
                         run_id="t-1")
    log = RunLog(run_dir)
    fence = log.claim("agent-1")
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    storage = shared_tier_storage(
        deadline_s=0.2, injection=parse_storage_injection(f"storage@mode=stall,while={fifo}"),
        log=log, node="n1", generation=fence.generation, holder=fence.holder)
    with pytest.raises(StorageTimeoutError):
        storage.fsync_path(tmp_path)
    _release(fifo)
    faults = [e for e in log.read() if e.kind == EntryKind.FAULT]
    assert [(f.payload["fault"], f.payload["node"], f.payload["background"]) for f in faults] \
        == [("storage_timeout", "n1", True)]


def test_storage_injections_parse_and_rank_faults_ignore_them() -> None:
    from hpcrun.runtime.faults import parse_injections

    text = "crash@step=3,rank=1;storage@mode=fail,while=/tmp/x,ops=rename+makedirs"
    got = parse_storage_injection(text)
    assert got is not None and (got.mode, got.while_path, got.ops) == (
        "fail", "/tmp/x", ("rename", "makedirs"))
    assert [str(i.kind) for i in parse_injections(text)] == ["crash"]
    assert parse_storage_injection("crash@step=3") is None
    with pytest.raises(SpecError, match=r"expected storage@mode=fail\|stall"):
        parse_storage_injection("storage@mode=melt,while=/x")


class Recorder:
    def __init__(self, rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.rc = rc

    def run(self, argv, *, input=None, env=None, timeout=None):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        return CommandResult(argv=tuple(argv), returncode=self.rc, stdout="",
                             stderr="not a lustre fs" if self.rc else "")


def test_lustre_striping_runs_lfs_setstripe_or_warns(tmp_path: Path) -> None:
    tier = SharedTierConfig(stripe_count=8, stripe_size="16M")
    ckpt = tmp_path / "ckpt"
    assert stripe_command(tier, ckpt) == ["lfs", "setstripe", "-c", "8", "-S", "16M", str(ckpt)]
    assert stripe_command(SharedTierConfig(deadline_s=30), ckpt) is None
    runner = Recorder()
    assert apply_striping(tier, ckpt, runner=runner, which=lambda _: "/usr/bin/lfs") is None
    assert runner.calls == [["lfs", "setstripe", "-c", "8", "-S", "16M", str(ckpt)]]
    warning = apply_striping(tier, ckpt, runner=Recorder(), which=lambda _: None)
    assert warning is not None and "`lfs` is not on PATH" in warning
    assert "default layout" in warning
    refused = apply_striping(tier, ckpt, runner=Recorder(rc=1), which=lambda _: "/bin/lfs")
    assert refused is not None and "not a lustre fs" in refused


def test_a_run_on_a_striped_site_without_lfs_is_created_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hpcrun sbatch`` on a site whose shared_tier asks for striping, where ``lfs`` is
    missing: the run is created and the user is told its layout is the default."""
    import yaml
    from click.testing import CliRunner

    from hpcrun.cli.main import cli
    from hpcrun.launch.site import site_configs_dir

    site = yaml.safe_load((site_configs_dir() / "testbed.yaml").read_text())
    site.update(name="striped", shared_path=str(tmp_path / "runs"),
                shared_tier={"stripe_count": 4, "stripe_size": "4M", "deadline_s": 30})
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "striped.yaml").write_text(yaml.safe_dump(site))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "name": "striped", "entrypoint": "examples.tiny_lm.train:main", "site": "striped"}))
    import shutil

    tools = tmp_path / "bin"  # git only: no lfs, no Slurm client
    tools.mkdir()
    (tools / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    monkeypatch.setenv("PATH", str(tools))
    out = CliRunner(env={"HPCRUN_SITE_CONFIGS": str(tmp_path / "sites"),
                         "HPCRUN_RUNS": str(tmp_path / "runs")}).invoke(
        cli, ["sbatch", str(tmp_path / "run.yaml")])
    assert out.exit_code == 0, out.output
    assert "striping (-c 4 -S 4M) but `lfs` is not on PATH" in out.output
    assert len(list((tmp_path / "runs").glob("striped-*/ckpt"))) == 1


def test_a_storage_fault_can_name_the_data_operations() -> None:
    injection = parse_storage_injection("storage@mode=stall,while=/x,ops=write_data+read_data")
    assert injection is not None and injection.ops == ("write_data", "read_data")
    default = parse_storage_injection("storage@mode=fail,while=/x")
    assert default is not None and {"write_data", "read_data", "rename"} <= set(default.ops)
