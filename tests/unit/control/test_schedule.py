"""`hpcrun watch --install`: hpcrun's block in the user's scrontab, or the crontab line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcrun.control.schedule import (
    BEGIN,
    END,
    install_watch,
    uninstall_watch,
    watch_entry,
)
from hpcrun.runner import CommandResult

ENTRY = watch_entry(argv=["/venv/bin/python", "-m", "hpcrun.cli.main", "watch"],
                    env={"HPCRUN_RUNS": "/lustre/me/runs"}, every_min=5,
                    log_path=Path("/lustre/me/runs/watch.log"),
                    scron_options=("--time=5", "-p", "debug"))


class FakeScrontab:
    """``scrontab -l`` / ``scrontab FILE`` over an in-memory table (None: not available)."""

    def __init__(self, table: str | None, *, disabled: bool = False) -> None:
        self.table, self.disabled = table, disabled

    def run(self, argv: Sequence[str], *, input: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float | None = None) -> CommandResult:
        if self.disabled:
            return CommandResult(argv=tuple(argv), returncode=1, stdout="",
                                 stderr="scrontab: error: scrontab is disabled on this cluster")
        if list(argv) == ["scrontab", "-l"]:
            if self.table is None:
                return CommandResult(argv=tuple(argv), returncode=1, stdout="",
                                     stderr="no crontab for root")
            return CommandResult(argv=tuple(argv), returncode=0, stdout=self.table, stderr="")
        self.table = Path(argv[1]).read_text()
        return CommandResult(argv=tuple(argv), returncode=0, stdout="", stderr="")


def test_the_entry_is_a_scron_block_running_watch_with_its_environment() -> None:
    assert ENTRY.splitlines() == [
        BEGIN, "#SCRON --time=5 -p debug",
        "*/5 * * * * HPCRUN_RUNS=/lustre/me/runs /venv/bin/python -m hpcrun.cli.main watch "
        ">> /lustre/me/runs/watch.log 2>&1", END]


def test_install_keeps_other_entries_and_a_reinstall_replaces_the_block() -> None:
    scron = FakeScrontab("#SCRON -t 1\n0 3 * * * ~/backup.sh\n")
    assert install_watch(ENTRY, runner=scron).scheduler == "scrontab"
    again = ENTRY.replace("*/5", "*/2")
    install_watch(again, runner=scron)
    assert scron.table == "#SCRON -t 1\n0 3 * * * ~/backup.sh\n" + again + "\n"
    assert "removed" in uninstall_watch(runner=scron).detail
    assert scron.table == "#SCRON -t 1\n0 3 * * * ~/backup.sh\n"
    assert "no hpcrun watch entry" in uninstall_watch(runner=scron).detail


def test_an_empty_scrontab_gets_the_block() -> None:
    scron = FakeScrontab(None)
    install_watch(ENTRY, runner=scron)
    assert scron.table == ENTRY + "\n"


def test_where_scrontab_is_disabled_the_crontab_line_is_given_instead() -> None:
    scron = FakeScrontab("", disabled=True)
    result = install_watch(ENTRY, runner=scron)
    assert result.scheduler == "crontab" and result.entry == ENTRY
    assert "crontab -e" in result.detail and scron.table == ""


class FakeSlurm(FakeScrontab):
    """No scrontab binary, a working sbatch/scancel."""

    def __init__(self) -> None:
        super().__init__(None)
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, input: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float | None = None) -> CommandResult:
        if argv[0] == "scrontab":
            from hpcrun.errors import SchedulerError

            raise SchedulerError("command not found: 'scrontab'")
        self.calls.append(list(argv))
        return CommandResult(argv=tuple(argv), returncode=0, stdout="77\n", stderr="")


def test_without_scrontab_the_pass_becomes_a_self_renewing_batch_job(tmp_path: Path) -> None:
    from hpcrun.control.schedule import chain_script

    script = tmp_path / ".watch-job.sh"
    text = chain_script(argv=["python", "-m", "hpcrun.cli.main", "watch"], env={"A": "1"},
                        every_min=2, log_path=tmp_path / "watch.log", script_path=script,
                        options=("--partition=debug",))
    slurm = FakeSlurm()
    result = install_watch(ENTRY, runner=slurm, chain=(script, text), every_min=2)
    assert result.scheduler == "sbatch" and "job 77" in result.detail
    assert script.read_text() == text
    assert f"sbatch --begin=now+2minutes --dependency=singleton {script}" in text
    assert "#SBATCH --partition=debug" in text and "export A=1" in text
    assert slurm.calls[-1] == ["sbatch", "--parsable", "--begin=now+2minutes",
                               "--dependency=singleton", str(script)]
    removed = uninstall_watch(runner=slurm, chain=script)
    assert "removed the self-renewing batch job" in removed.detail and not script.exists()
    assert slurm.calls[-1] == ["scancel", "--name=hpcrun-watch", "--state=PENDING"]
