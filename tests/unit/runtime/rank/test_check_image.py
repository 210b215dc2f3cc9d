"""A rank started in an image checks it runs its agent's hpcrun before anything else."""

from __future__ import annotations

import os

import pytest

from hpcrun.errors import ConfigError
from hpcrun.launch.container import HOST_DIGEST_ENV, HOST_VERSION_ENV, host_environ
from hpcrun.runtime.rank.worker import check_image, classify
from hpcrun.version import __version__


def test_a_rank_on_the_host_checks_nothing() -> None:
    assert check_image({}) is None


def test_a_rank_with_its_agents_hpcrun_records_its_root() -> None:
    seen = check_image(host_environ())
    root = os.stat("/")
    assert seen is not None and seen["image_root_id"] == f"{root.st_dev}:{root.st_ino}"


def test_another_hpcrun_in_the_image_is_a_user_error_naming_both_sides() -> None:
    env = {HOST_VERSION_ENV: "0.0.1", HOST_DIGEST_ENV: "sha256:" + "0" * 64}
    with pytest.raises(ConfigError) as err:
        check_image(env)
    assert f"hpcrun in the container is {__version__}" in str(err.value)
    assert "but the agent's is 0.0.1 (sha256:000000000000)" in str(err.value)
    assert classify(err.value) == "user_error"  # not retried (retry.max_attempts: 0)
