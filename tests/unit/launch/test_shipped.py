"""The shipped site configs and job template: found in a checkout and after a wheel install."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from hpcrun.errors import ConfigError
from hpcrun.launch.sbatch import sbatch_templates_dir
from hpcrun.launch.shipped import shipped_dir
from hpcrun.launch.site import site_configs_dir

ROOT = Path(__file__).resolve().parents[3]


def test_every_shipped_file_is_installed_by_a_wheel() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {f"{target.split('/')[-1]}/{Path(src).name}"
              for target, files in cfg["options.data_files"].items()
              for src in files.split() if src}
    shipped = {f"{d.name}/{p.name}" for d in (site_configs_dir(), sbatch_templates_dir())
               for p in d.iterdir() if p.is_file()}
    assert listed == shipped  # add a new site config or template to setup.cfg's data_files


def test_installed_layout_is_found_and_a_broken_install_says_so(tmp_path: Path) -> None:
    share = tmp_path / "share" / "hpcrun"
    (share / "site_configs").mkdir(parents=True)
    assert shipped_dir("site_configs", roots=[tmp_path / "nope", share]) == share / "site_configs"
    with pytest.raises(ConfigError, match=r"sbatch_templates/ is missing.*reinstall hpcrun"):
        shipped_dir("sbatch_templates", roots=[share])
