"""No value of a spec or a site config can add a directive, split an argument or disarm a guard.

Property tests over random text in every slot a value reaches in the job script: either the
value is refused (one ConfigError naming its key) because it holds a control character, or
``bash -n`` accepts the script, its ``#SBATCH`` block holds exactly the directives hpcrun meant,
and a failing setup line still ends the job whatever text follows it.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hpcrun.errors import ConfigError, HpcrunError
from hpcrun.launch.jobsetup import MODELED_OPTIONS, SBATCH_OPTIONS
from hpcrun.launch.sbatch import format_flag, render_sbatch, sbatch_args
from hpcrun.launch.scriptslots import env_name, guarded_setup, one_line, word
from hpcrun.launch.site import SiteConfig, load_site, site_from_dict
from hpcrun.launch.submit import setup_lines
from tests.unit.launch.test_sbatch import make_spec

RUN_DIR = Path("/shared/runs/tiny-1")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
SLOW = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
# text with the characters that break scripts, plus anything else
NASTY = st.text(alphabet=st.sampled_from(list("ab $`'\"\\;&|#\n\r\t\x00()*?<>{}=-")) |
                st.characters(codec="utf-8"), min_size=1, max_size=24)
# one line, but every shell metacharacter: what must be quoted rather than refused
SHELLY = st.text(alphabet=st.sampled_from(list("ab $`'\"\\;&|#()*?<>{}=-,:/~!%")),
                 min_size=1, max_size=24)


def _bash_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True,
                          check=False).returncode == 0


def _directives(script: str) -> list[str]:
    return [ln.removeprefix("#SBATCH ") for ln in script.splitlines()
            if ln.startswith("#SBATCH")]


def _render(spec_over: dict[str, object], site: SiteConfig) -> tuple[str, list[str]] | None:
    try:
        spec = make_spec(**spec_over)
        script = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="tiny.submit.0",
                               python="/usr/bin/python3")
    except (ConfigError, HpcrunError):
        return None
    meant = [format_flag(k, v) for k, v in sbatch_args(spec, site, run_dir=RUN_DIR,
                                                         op_id="tiny.submit.0")]
    return script, meant


@SLOW
@given(value=NASTY, slot=st.sampled_from(["partition", "account", "qos", "constraint"]))
def test_a_spec_value_in_a_directive_is_refused_or_stays_one_directive(value: str,
                                                                       slot: str) -> None:
    out = _render({slot: value}, load_site("testbed"))
    if out is None:
        assert CONTROL.search(value) or not value.strip(), repr(value)
        return
    script, meant = out
    assert not CONTROL.search(value)
    assert _bash_ok(script)
    assert _directives(script) == meant


@SLOW
@given(value=NASTY, slot=st.sampled_from(["modules", "env", "setup"]))
def test_a_site_value_is_refused_or_leaves_the_script_well_formed(value: str, slot: str) -> None:
    change = {"modules": {"modules": (value,)}, "env": {"env": {"SITE_VAR": value}},
              "setup": {"setup": (value,)}}[slot]
    site = dataclasses.replace(load_site("testbed"), **change)  # type: ignore[arg-type]
    spec = make_spec()
    try:
        script = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="op", python="python3")
        lines = setup_lines(site, run_dir=RUN_DIR, op_id="op")
    except ConfigError as exc:
        allowed = CONTROL if slot != "setup" else re.compile(
            r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
        assert allowed.search(value), (value, exc)
        return
    assert _bash_ok(script) and _bash_ok("\n".join(lines))
    assert _directives(script) == [format_flag(k, v) for k, v in sbatch_args(
        spec, site, run_dir=RUN_DIR, op_id="op")]


EXTRA_OPTIONS = ["mail-type", "reservation", "mem", "licenses", "gpu-bind"]
"""sbatch options a spec or a site may add (none of them set by hpcrun itself)."""
ALLOWED = SBATCH_OPTIONS - set(MODELED_OPTIONS)


def _one_line_refusal(exc: HpcrunError) -> str:
    event("refused")
    text = str(exc)
    assert len(text.splitlines()) == 1, text  # a refusal is one line, whatever the value
    return text


def _srun_argv(script: str) -> list[str]:
    """The agents' ``srun`` arguments as bash passes them (the command run with a stand-in
    ``srun`` that prints each argument)."""
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    command = " ".join(ln.rstrip("\\") for ln in lines[start:start + 3]).rstrip(" &")
    out = subprocess.run(["bash", "-c", 'srun() { printf "%s\\0" "$@"; }\n' + command],
                         capture_output=True, check=True)
    return out.stdout.decode().split("\0")[:-1]


def _site_with(**keys: object) -> SiteConfig:
    """The testbed site with ``keys`` changed, validated as a site file is."""
    raw = {**load_site("testbed").to_dict(), **keys}
    return site_from_dict(raw, source="hostile.yaml")


@settings(SLOW, max_examples=100)
@given(option=st.one_of(*[st.sampled_from([*EXTRA_OPTIONS, "nodes", "comment"])] * 3, NASTY),
       value=SHELLY | NASTY,
       where=st.sampled_from(["spec", "site"]))
def test_an_sbatch_extra_value_is_refused_in_one_line_or_stays_one_directive(
        option: str, value: str, where: str) -> None:
    try:
        site = _site_with(sbatch_extra={option: value}) if where == "site" else \
            load_site("testbed")
        spec = make_spec(**({"sbatch_extra": {option: value}} if where == "spec" else {}))
        script = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="op", python="python3")
    except HpcrunError as exc:
        text = _one_line_refusal(exc)
        assert CONTROL.search(value) or option not in ALLOWED, text
        return
    event("rendered")
    assert option in ALLOWED and not CONTROL.search(value)
    assert _bash_ok(script)
    meant = [format_flag(k, v) for k, v in sbatch_args(spec, site, run_dir=RUN_DIR,
                                                         op_id="op")]
    assert _directives(script) == meant
    own = [shlex.split(d) for d in _directives(script) if d.split("=")[0] == f"--{option}"]
    assert own == [[f"--{option}={value}" if value else f"--{option}"]]


@settings(SLOW, max_examples=100)
@given(image=SHELLY | NASTY, src=SHELLY | NASTY, dst=SHELLY | NASTY)
def test_a_pyxis_image_or_mount_is_refused_in_one_line_or_reaches_srun_as_one_argument(
        image: str, src: str, dst: str) -> None:
    mount = f"{src}:{dst}"
    try:
        site = _site_with(container={"runtime": "pyxis", "image": image, "mounts": [mount]})
        spec = make_spec()
        script = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="op", python="python3")
    except HpcrunError as exc:
        text = _one_line_refusal(exc)
        assert (CONTROL.search(image + mount) or not image.strip() or "," in mount
                or mount.startswith(":")), text
        return
    event("rendered")
    assert _bash_ok(script)
    assert _directives(script) == [format_flag(k, v) for k, v in sbatch_args(
        spec, site, run_dir=RUN_DIR, op_id="op")]
    argv = _srun_argv(script)
    assert f"--container-image={image}" in argv and f"--container-mounts={mount}" in argv
    assert argv[-5:] == ["python3", "-m", "hpcrun.runtime", "--run-dir", str(RUN_DIR)]


@SLOW
@given(tail=st.text(alphabet=st.sampled_from(list("ab $`'\";&|#()\\\n")), max_size=20))
def test_a_failing_setup_line_ends_the_job_whatever_follows_it(tail: str) -> None:
    script = f"{guarded_setup('false # ' + tail)}\necho reached\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "reached" not in out.stdout
    assert "site setup line failed" in out.stderr


def test_a_setup_line_with_a_comment_keeps_its_guard() -> None:
    # the guard used to be appended after the line: `false # note || { ... exit 1; }` lost it
    out = subprocess.run(["bash", "-c", guarded_setup("false # load the compiler") + "\nexit 7"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 1


def test_a_failing_line_of_a_multi_line_setup_value_ends_the_job() -> None:
    # eval's status is its last command's: `false` followed by a line that succeeds passed
    for value in ("false\ntrue", "false # note\n$&", "export A=1\nfalse\necho reached"):
        out = subprocess.run(["bash", "-c", guarded_setup(value) + "\necho reached"],
                             capture_output=True, text=True, check=False)
        assert out.returncode == 1 and "reached" not in out.stdout, (value, out)
        assert "site setup line failed" in out.stderr


def test_a_multi_line_setup_value_runs_in_the_job_shell_with_conditions_intact() -> None:
    value = "export HPCRUN_PROBE=6\nif false; then exit 9; fi\n[ -z x ] || HPCRUN_PROBE=7"
    out = subprocess.run(["bash", "-c", guarded_setup(value) + '\necho "$HPCRUN_PROBE"'],
                         capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "7")


def test_setup_lines_export_into_the_job_shell() -> None:
    out = subprocess.run(["bash", "-c", guarded_setup("export HPCRUN_PROBE=$((6*7))") +
                          '\necho "$HPCRUN_PROBE"'], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "42"


@pytest.mark.parametrize("bad", ["batch\n#SBATCH --uid=0", "a\rb", "nul\x00", "tab\there"])
def test_a_control_character_is_one_error_naming_the_key(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^partition .* holds the control character"):
        one_line(bad, key="partition")


def test_a_word_survives_the_shell_as_one_argument() -> None:
    value = "a b; $(touch /tmp/x) `id` 'q' \"d\""
    out = subprocess.run(["bash", "-c", f"printf '%s|' {word(value, key='v')}"],
                         capture_output=True, text=True, check=False)
    assert out.stdout == value + "|"


@pytest.mark.parametrize("name", ["1X", "X Y", "X=1;id", "", "A-B"])
def test_an_env_name_that_is_not_a_variable_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="is not a variable name"):
        env_name(name)


def test_submit_refuses_a_site_value_that_would_break_the_script_before_anything_exists(
        tmp_path: Path) -> None:
    import yaml

    from hpcrun.launch.site import SITE_CONFIGS_ENV
    from hpcrun.testing.runs import hpcrun, write_spec

    site = yaml.safe_load((Path(__file__).parents[3] / "site_configs" / "testbed.yaml")
                          .read_text())
    site.update(name="hostile", modules=["gcc\n#SBATCH --uid=0"])
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "hostile.yaml").write_text(yaml.safe_dump(site))
    spec = write_spec(tmp_path / "run.yaml", {"name": "tiny", "site": "hostile",
                                              "entrypoint": "examples.tiny_lm.train:main"})
    runs = tmp_path / "runs"
    done = hpcrun("submit", str(spec), "--dry-run", "--backend", "slurm",
                  env={SITE_CONFIGS_ENV: str(sites), "HPCRUN_RUNS": str(runs)},
                  cwd=Path(__file__).parents[3])
    assert done.returncode == 2, done.stderr
    assert "site modules[0] 'gcc\\n#SBATCH --uid=0' holds the control character" in done.stderr
    assert not runs.exists() or not any(runs.iterdir())
