"""``hpcrun spec explain``, docs/spec.md and docs/site.md, and a bad spec refused whole."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.testing.runs import hpcrun, write_spec

REPO_ROOT = Path(__file__).resolve().parents[3]


def _explain(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["spec", "explain", *args])
    return result.exit_code, result.stdout, result.stderr


def test_markdown_is_exactly_what_docs_spec_md_and_docs_site_md_hold() -> None:
    for flags, page in (((), "docs/spec.md"), (("--site",), "docs/site.md")):
        code, out, _ = _explain(*flags, "--markdown")
        assert code == 0
        path = REPO_ROOT / page
        assert path.exists(), f"{page} is missing: run make spec-docs"
        assert path.read_text() == out, f"{page} is stale: run make spec-docs"


def test_every_site_field_is_in_docs_site_md_with_its_default() -> None:
    text = (REPO_ROOT / "docs" / "site.md").read_text()
    assert "| `preempt_signal` | string | `\"USR1\"` |  | Signal Slurm sends" in text
    assert "| `gpus_per_node` | integer | `0` |" in text
    assert "| `container.runtime` | string | required | pyxis, apptainer, charliecloud |" in text
    assert "| `shared_tier.deadline_s` | number | `300` |" in text


def test_a_key_prints_its_facts_and_meaning() -> None:
    code, out, _ = _explain("resources.nodes")
    assert code == 0
    assert out == ("resources.nodes: integer; default 1; allowed: >= 1; in the spec digest: "
                   "yes\n    Nodes the gang runs on.\n")


def test_a_section_prints_every_key_under_it_and_no_key_prints_all() -> None:
    _, section, _ = _explain("checkpoint")
    keys = [line.split(":")[0] for line in section.splitlines() if not line.startswith(" ")]
    assert keys[0] == "checkpoint" and "checkpoint.keep_last" in keys
    assert all(k == "checkpoint" or k.startswith("checkpoint.") for k in keys)
    _, every, _ = _explain()
    assert "resources.nodes: integer" in every and "sdc.policy: string" in every
    _, site, _ = _explain("--site", "preempt_mode")
    assert site.startswith("preempt_mode: string; default \"requeue\"; allowed: requeue, "
                           "cancel, off\n")


def test_an_unknown_key_is_one_error_line_with_a_suggestion_and_exit_2() -> None:
    out = hpcrun("spec", "explain", "resources.node", cwd=REPO_ROOT)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("hpcrun: error: unknown key "
                                                                 "'resources.node'")
    assert "did you mean 'resources.nodes'" in out.stderr
    site = hpcrun("spec", "explain", "--site", "partiton", cwd=REPO_ROOT)
    assert site.returncode == 2 and "did you mean 'partition'" in site.stderr
    assert "`hpcrun spec explain --site`" in site.stderr


def test_submit_dry_run_of_a_spec_with_four_problems_prints_each_and_creates_nothing(
        tmp_path: Path) -> None:
    spec = _four_problems(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    out = hpcrun("submit", str(spec), "--dry-run", "--backend", "local", cwd=REPO_ROOT,
                 env={"HPCRUN_RUNS": str(runs), "HOME": str(tmp_path / "home"),
                      "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert "nothing was created: 4 problems found" in out.stderr
    problems = [line.strip() for line in out.stderr.splitlines() if line.startswith("  ")]
    assert [p.split(": ")[2] for p in problems] == [
        "resources.nodez", "resources.nodes", "checkpoint.keep_last", "retry.backoff_factor"]
    assert problems[1] == (f"spec: {spec}: resources.nodes: expected an integer >= 1, found 0; "
                           "set nodes to 1 or more")
    assert "did you mean 'nodes'" in problems[0]
    assert "expected a number, found 'fast'" in problems[3]
    assert list(runs.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "runs"]


def _four_problems(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "bad.yaml", {
        "name": "tiny", "entrypoint": "examples.tiny_lm.train:main",
        "resources": {"nodes": 0, "nodez": 2}, "checkpoint": {"keep_last": 1},
        "retry": {"backoff_factor": "fast"}})


def test_sbatch_and_preflight_of_that_spec_list_the_same_four_lines_and_exit_2(
        tmp_path: Path) -> None:
    spec = _four_problems(tmp_path)
    env = {"HPCRUN_RUNS": str(tmp_path / "runs"), "HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(REPO_ROOT)}
    sbatch = hpcrun("sbatch", str(spec), cwd=REPO_ROOT, env=env)
    assert sbatch.returncode == 2 and sbatch.stdout == "", sbatch.stderr
    assert "nothing was created: 4 problems found" in sbatch.stderr
    preflight = hpcrun("preflight", str(spec), cwd=REPO_ROOT, env=env)
    assert preflight.returncode == 2, preflight.stdout + preflight.stderr
    rows = [ln for ln in preflight.stdout.splitlines() if ln.startswith("spec ")]
    assert [r.split()[1] for r in rows] == ["FAIL"] * 4
    assert [r.split(": ")[1] for r in rows] == [
        "resources.nodez", "resources.nodes", "checkpoint.keep_last", "retry.backoff_factor"]
    assert not (tmp_path / "runs").exists()


def test_a_spec_error_outside_submit_prints_each_problem_on_its_own_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "sweep.yaml", {
        "name": "tiny", "entrypoint": "examples.tiny_lm.train:main",
        "resources": {"nodes": 0, "tasks_per_node": 0}})
    out = hpcrun("sweep", str(spec), "--grid", "resources.cpus_per_task=1,2", "--dry-run",
                 cwd=REPO_ROOT, env={"HPCRUN_RUNS": str(tmp_path / "runs")})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        f"hpcrun: error: {spec}: resources.nodes: expected an integer >= 1, found 0; set nodes "
        "to 1 or more",
        f"  {spec}: resources.tasks_per_node: expected an integer >= 1, found 0; set "
        "tasks_per_node to 1 or more"]
    assert not (tmp_path / "runs").exists()
