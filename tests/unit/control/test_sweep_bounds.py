"""A sweep's own settings are bounded, each refused in one line before anything is created:
max_parallel an integer >= 1, at most the site's ``sweep_max_points`` points (counted before a
single one is built), and ``--grid`` values YAML's safe loader reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcrun.control.sweep import SweepPlan, expand_points, parse_grid_option
from hpcrun.errors import ConfigError, SpecError
from hpcrun.launch.site import SITE_CONFIGS_ENV, load_site, site_from_dict

CHECKOUT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "2", True])
def test_max_parallel_must_be_an_integer_of_at_least_one(bad: object) -> None:
    with pytest.raises(SpecError, match=r"^max_parallel: expected an integer >= 1, found"):
        SweepPlan(max_parallel=bad)  # type: ignore[arg-type]


def test_a_grid_over_the_point_cap_is_refused_before_it_is_expanded() -> None:
    huge = SweepPlan(grid=(("config.a", tuple(range(100))), ("config.b", tuple(range(100))),
                           ("config.c", tuple(range(100)))))  # 10^6 points: never built
    with pytest.raises(SpecError, match=r"^the sweep has 1000000 points, more than the cap of "
                                        r"1000 \(the site's sweep_max_points\); split it into "
                                        r"several sweeps, sweep fewer values, or raise "
                                        r"sweep_max_points in the site config"):
        expand_points(huge, max_points=1000)


def test_a_sweep_at_the_cap_expands() -> None:
    plan = SweepPlan(grid=(("config.a", tuple(range(10))), ("config.b", tuple(range(100)))))
    assert len(expand_points(plan, max_points=1000)) == 1000
    with pytest.raises(SpecError, match="1000 points, more than the cap of 999"):
        expand_points(plan, max_points=999)


def test_the_point_cap_is_a_site_setting_of_1000_by_default() -> None:
    assert load_site("testbed").sweep_max_points == 1000
    raw = load_site("testbed").to_dict()
    assert site_from_dict({**raw, "sweep_max_points": 5000}).sweep_max_points == 5000
    for bad in (0, -3):
        with pytest.raises(ConfigError, match=r"key 'sweep_max_points': expected an integer "
                                              rf">= 1, found {bad}; write the most points"):
            site_from_dict({**raw, "sweep_max_points": bad})
    with pytest.raises(ConfigError, match=r"key 'sweep_max_points': expected an integer"):
        site_from_dict({**raw, "sweep_max_points": 2.5})


@pytest.mark.parametrize(("item", "why"), [
    ("config.lr=[1,2", "expected ',' or ']'"),
    ("config.lr=*a", "found undefined alias 'a'"),
    ("config.lr=!!python/object:os.system", "could not determine a constructor for the tag"),
    ('config.lr=1e-3,"x', "found unexpected end of stream"),
])
def test_a_grid_value_that_is_not_yaml_is_one_error_naming_the_item(item: str,
                                                                     why: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_grid_option(item)
    text = str(info.value)
    assert text.startswith(f"--grid {item!r}: value ") and why in text, text
    assert "expected KEY=V1,V2,... with plain values" in text and "\n" not in text
    assert isinstance(info.value.__cause__, type(None))  # not chained onto the YAML traceback


def _sweep_cli(tmp_path: Path, *args: str, site_dirs: Path | None = None
               ) -> tuple[int, str, Path]:
    """``hpcrun sweep`` in a child process on a tiny spec; (exit status, stderr, runs root)."""
    from hpcrun.testing.runs import hpcrun, write_spec

    spec = write_spec(tmp_path / "run.yaml", {"name": "tiny", "site": "testbed",
                                              "entrypoint": "examples.tiny_lm.train:main"})
    runs = tmp_path / "runs"
    env = {"HPCRUN_RUNS": str(tmp_path / "index")}
    if site_dirs is not None:
        env[SITE_CONFIGS_ENV] = str(site_dirs)
    done = hpcrun("sweep", str(spec), *args, "--backend", "local", "--runs-root", str(runs),
                  env=env, cwd=CHECKOUT)
    return done.returncode, done.stderr, tmp_path


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_cli_refuses_a_malformed_grid_value_in_one_line_and_creates_nothing(
        tmp_path: Path, dry_run: bool) -> None:
    rc, err, root = _sweep_cli(tmp_path, "--grid", "config.lr=[1,2",
                               *(["--dry-run"] if dry_run else []))
    assert rc not in (0, 1), err  # 1 would be an uncaught exception's traceback
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--grid 'config.lr=[1,2': value '[1' is not valid YAML" in err
    assert not (root / "runs").exists() and not (root / "index").exists()


def test_the_cli_refuses_a_sweep_past_the_sites_cap_naming_count_and_cap(
        tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    raw = yaml.safe_load((CHECKOUT / "site_configs" / "testbed.yaml").read_text())
    (sites / "capped.yaml").write_text(yaml.safe_dump({**raw, "name": "capped",
                                                       "sweep_max_points": 3}))
    rc, err, root = _sweep_cli(tmp_path, "--site", "capped", "--grid", "config.lr=1,2",
                               "--grid", "config.seed=1,2", "--dry-run", site_dirs=sites)
    assert rc not in (0, 1), err
    assert "the sweep has 4 points, more than the cap of 3 (the site's sweep_max_points)" in err
    assert not (root / "runs").exists() and not (root / "index").exists()
