"""One name for a run, end to end on the local backend: with ``$HPCRUN_RUNS`` unset the run
lands under its site's ``shared_path``, and every command finds it by a prefix of its id."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcrun.control.record import read_record
from hpcrun.drill.states import committed
from hpcrun.testing.runs import hpcrun, tiny_spec, wait_for_state, write_spec
from tests.integration.local_helpers import REPO_ROOT, states, tiny_manifest, wait_until

SITE = """\
schema_version: 1
name: refsite
backend: local
node_local_path: {root}/node-local
shared_path: {root}/shared
env:
  OMP_NUM_THREADS: 1
preempt_signal: USR1
preempt_lead_s: 0
preempt_mode: cancel
"""
STEPS = 60


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A site config in its own directory, a private home, and no ``$HPCRUN_RUNS``."""
    monkeypatch.delenv("HPCRUN_RUNS", raising=False)
    monkeypatch.delenv("HPCRUN_SITE", raising=False)
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "refsite.yaml").write_text(SITE.format(root=tmp_path))
    return {"HPCRUN_SITE_CONFIGS": str(tmp_path / "sites"), "HOME": str(tmp_path / "home")}


def _ok(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = hpcrun(*args, env=env, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, f"hpcrun {' '.join(args)}: {out.stderr[-2000:]}"
    return out


def test_every_command_takes_a_prefix_of_the_run_id_under_the_sites_shared_path(
        tmp_path: Path, env: dict[str, str]) -> None:
    spec = tiny_spec(manifest=tiny_manifest(), site="refsite", tasks_per_node=1, steps=STEPS,
                     every_steps=10, name="runref")
    # Rank 0 is slowed (1 s per step: 50 s left after the first commit, in the first
    # incarnation only) so the signal, sent after the two status calls of a loaded machine,
    # finds the run training.
    out = _ok(env, "submit", str(write_spec(tmp_path / "run.yaml", spec)),
              "--inject", "slow@step=1,rank=0,seconds=1.0")
    run_id = out.stdout.split()[0]
    run = tmp_path / "shared" / run_id
    assert (run / "log").is_dir()  # the site's shared_path is the runs root
    assert not (tmp_path / "home" / "hpcrun-runs").exists()  # found there without a link
    ref = run_id[:-2]  # a unique prefix

    wait_until(run, lambda r: r.step >= 10 and committed(run), timeout=120,
               what="first commit")
    status = _ok(env, "status", ref)
    assert f"run         {run_id}" in status.stdout and "RUNNING" in status.stdout
    body = json.loads(_ok(env, "status", ref, "--json").stdout)
    assert body["state"] == body["facts"]["state"] == "RUNNING"
    sent = _ok(env, "signal", ref)
    assert f"sent SIGUSR1 to {run_id} (local backend)" in sent.stdout
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
    assert (str(record.state), record.step) == ("SUCCEEDED", STEPS)
    seen = states(run)
    assert seen.count("PREEMPTED") == 1 and seen.count("REQUEUED") == 1, seen
    assert read_record(run).requeues == 1

    latest = committed(run)[-1].ckpt_id
    assert latest[:16] in _ok(env, "ckpt", "ls", ref).stdout
    assert "[shared] ok" in _ok(env, "ckpt", "verify", ref).stdout
    _ok(env, "logs", ref, "--rank", "0")  # tiny_lm's ranks print nothing: their files exist
    no_rank = hpcrun("logs", ref, "--rank", "9", env=env, cwd=REPO_ROOT)
    assert no_rank.returncode == 2 and f"{run}/logs; ranks with output: [0, 1]" in no_rank.stderr

    page = tmp_path / "report.html"
    assert "wrote" in _ok(env, "report", ref, "-o", str(page)).stdout and page.stat().st_size
    missing = hpcrun("status", "nosuch", env=env, cwd=REPO_ROOT)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert f"{tmp_path / 'shared'} (site 'refsite')" in missing.stderr
