"""``submit --dry-run --after RUN`` resolves RUN like a real submit: an upstream that does not
exist is the same one-line error and exit 2, and nothing is created."""

from __future__ import annotations

from pathlib import Path

from hpcrun.testing.runs import hpcrun, write_spec

REPO = Path(__file__).resolve().parents[3]


def test_a_dry_run_after_a_run_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "run.yaml", {"name": "t",
                                              "entrypoint": "examples.tiny_lm.train:main"})
    runs = tmp_path / "runs"
    done = hpcrun("submit", str(spec), "--dry-run", "--backend", "local", "--after",
                  "no-such-run", env={"HPCRUN_RUNS": str(runs)}, cwd=REPO)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--after no-such-run: no run or sweep 'no-such-run'" in done.stderr
    assert "nothing was submitted" in done.stderr
    assert not runs.exists() or not any(runs.iterdir())
