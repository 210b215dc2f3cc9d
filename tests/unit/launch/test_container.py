"""Containers: the rank's command line per runtime, the binds, the submit checks and the
in-image hpcrun check (pure, no runtime started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.errors import ConfigError
from hpcrun.launch.container import (
    HOST_DIGEST_ENV,
    HOST_VERSION_ENV,
    ContainerConfig,
    ContainerRuntime,
    check_same_hpcrun,
    container_from_dict,
    container_problems,
    package_digest,
    rank_binds,
    rank_command,
    render_container,
    root_mount,
)

WORKER = ["/venv/bin/python", "-m", "hpcrun.runtime.rank.worker"]


def _ch(**kw: object) -> ContainerConfig:
    return ContainerConfig(runtime=ContainerRuntime.CHARLIECLOUD, image="/img/torch", **kw)  # type: ignore[arg-type]


def test_charliecloud_starts_the_rank_through_ch_run_with_its_binds() -> None:
    cmd = rank_command(_ch(flags=("--set-env=/ch/environment",)), WORKER,
                       binds=("/runs/r:/runs/r",), cwd="/code")
    assert cmd == ["ch-run", "--bind=/runs/r:/runs/r", "--cd=/code", "--set-env=/ch/environment",
                   "/img/torch", "--", *WORKER]


def test_apptainer_passes_nv_only_when_the_site_has_gpus() -> None:
    app = ContainerConfig(runtime=ContainerRuntime.APPTAINER, image="/i.sif")
    assert rank_command(app, WORKER, binds=("/a:/a",), cwd="/code") == [
        "apptainer", "exec", "--nv", "--bind=/a:/a", "--pwd", "/code", "/i.sif", *WORKER]
    no_gpu = ContainerConfig(runtime=ContainerRuntime.APPTAINER, image="/i.sif", gpus=False)
    assert rank_command(no_gpu, WORKER) == ["apptainer", "exec", "/i.sif", *WORKER]


def test_without_a_container_or_under_pyxis_the_rank_argv_is_unchanged() -> None:
    pyxis = ContainerConfig(runtime=ContainerRuntime.PYXIS, image="nvcr.io#x")
    assert rank_command(None, WORKER) == WORKER == rank_command(pyxis, WORKER)
    # the agents' interpreter is never wrapped: only Pyxis touches the agents' srun
    assert render_container(_ch(), ["-n", "2"], "python3") == (["-n", "2"], "python3")
    assert render_container(pyxis, [], "python3")[0] == ["--container-image=nvcr.io#x"]


def test_binds_are_the_sites_mounts_then_one_per_tree_not_already_mounted() -> None:
    binds = rank_binds(["/runs/r/x", "/runs/r", None, "/code", "/code/.venv", "/", "/code/",
                        "/scratch/local/hpcrun/42", "/lustre/data"],
                       ("/lustre:/lustre:ro", "/scratch/local:/scratch/local", "/a:/b"))
    assert binds == ("/lustre:/lustre:ro", "/scratch/local:/scratch/local", "/a:/b",
                     "/code:/code", "/runs/r:/runs/r")


def test_apptainer_flags_that_drop_the_environment_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"'--cleanenv' would drop the rank's environment"):
        ContainerConfig(runtime=ContainerRuntime.APPTAINER, image="/i.sif",
                        flags=("--cleanenv",))


def test_a_site_container_round_trips_and_names_the_runtimes_it_knows() -> None:
    raw = {"runtime": "charliecloud", "image": "/img", "mounts": ["/d:/d"], "gpus": False,
           "python": "/usr/bin/python3"}
    c = container_from_dict(raw, source="s.yaml")
    assert c is not None and c.runtime is ContainerRuntime.CHARLIECLOUD and c.ranks_inside
    assert container_from_dict(c.to_dict(), source="s.yaml") == c
    with pytest.raises(ConfigError, match=r"expected pyxis, apptainer, charliecloud, found "
                       r"'docker'"):
        container_from_dict({"runtime": "docker", "image": "x"}, source="s.yaml")


def test_submit_checks_the_image_and_the_runtime_on_the_local_backend(tmp_path: Path) -> None:
    missing = ContainerConfig(runtime=ContainerRuntime.CHARLIECLOUD, image=str(tmp_path / "no"))
    [problem] = container_problems(missing, backend="slurm", which=lambda c: "/usr/bin/" + c)
    assert "expected a readable image directory" in problem
    image = tmp_path / "img"
    (image / "usr").mkdir(parents=True)
    ok = ContainerConfig(runtime=ContainerRuntime.CHARLIECLOUD, image=str(image))
    assert container_problems(ok, backend="local", which=lambda c: "/usr/bin/" + c) == []
    [absent] = container_problems(ok, backend="local", which=lambda c: None)
    assert "'ch-run' is not on PATH" in absent
    assert container_problems(ok, backend="slurm", which=lambda c: None) == []  # nodes' PATH
    sif = ContainerConfig(runtime=ContainerRuntime.APPTAINER, image=str(image))
    assert "expected a readable .sif file" in container_problems(
        sif, backend="slurm", which=lambda c: c)[0]


def test_a_rank_refuses_an_hpcrun_that_is_not_its_agents() -> None:
    env = {HOST_VERSION_ENV: "1.2.0", HOST_DIGEST_ENV: "sha256:" + "a" * 64}
    check_same_hpcrun(env, version="1.2.0", digest="sha256:" + "a" * 64)
    check_same_hpcrun({}, version="9", digest="x")  # on the host: nothing to compare
    with pytest.raises(ConfigError, match=r"^hpcrun in the container is 1.3.0 "
                       r"\(sha256:bbbbbbbbbbbb\) but the agent's is 1.2.0 "
                       r"\(sha256:aaaaaaaaaaaa\); expected the same"):
        check_same_hpcrun(env, version="1.3.0", digest="sha256:" + "b" * 64)


def test_the_package_digest_is_stable_and_names_the_sources() -> None:
    assert package_digest() == package_digest()
    assert package_digest().startswith("sha256:")


def test_the_root_mount_is_the_image_directory_inside_ch_run() -> None:
    host = "22 1 0:21 / / rw,relatime - overlay overlay rw\n23 22 0:5 / /dev rw - devtmpfs x rw\n"
    inside = ("136 156 254:0 /tmp/img / ro,relatime - ext4 /dev/vda rw\n"
              "137 136 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw\n")
    assert root_mount(host) == "/"
    assert root_mount(inside) == "/tmp/img"


def test_admission_refuses_a_missing_image_and_skips_pyxis(tmp_path: Path) -> None:
    from hpcrun.launch.admission import Passed, Problem, Skipped
    from hpcrun.launch.admit import container_findings
    from hpcrun.launch.site import load_site

    base = "name: x\nnode_local_path: /l\nshared_path: /s\n"
    site = tmp_path / "s.yaml"
    site.write_text(base + f"container: {{runtime: charliecloud, image: {tmp_path / 'no'}}}\n")
    [missing] = container_findings(load_site(str(site)), "slurm")
    assert isinstance(missing, Problem) and "expected a readable image directory" in missing.what
    (tmp_path / "img" / "usr").mkdir(parents=True)
    site.write_text(base + f"container: {{runtime: charliecloud, image: {tmp_path / 'img'}}}\n")
    [ok] = container_findings(load_site(str(site)), "slurm")
    assert isinstance(ok, Passed) and "hpcrun preflight" in ok.what
    site.write_text(base + "container: {runtime: pyxis, image: 'nvcr.io#x'}\n")
    assert isinstance(container_findings(load_site(str(site)), "slurm")[0], Skipped)


@pytest.mark.parametrize(("raw", "refusal"), [
    ({"image": "nvcr.io#torch\n#SBATCH --uid=0"},
     r"^s\.yaml: container\.image 'nvcr\.io#torch\\n#SBATCH --uid=0' holds the control "),
    ({"mounts": ["/a:/a\r"]}, r"^s\.yaml: container\.mounts\[0\] '/a:/a\\r' holds the control"),
    ({"mounts": ["/a:/a,/etc:/etc"]},
     r"^s\.yaml: container\.mounts\[0\]: expected one SRC:DST\[:FLAGS\] mount, found "
     r"'/a:/a,/etc:/etc' whose ',' would split it into two for --container-mounts; write each"),
    ({"flags": ["--container-writable\x00"]}, r"^s\.yaml: container\.flags\[0\] "),
])
def test_a_pyxis_value_that_would_break_its_srun_argument_is_one_error_naming_the_key(
        raw: dict[str, object], refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal) as info:
        container_from_dict({"runtime": "pyxis", "image": "nvcr.io#torch", **raw},
                            source="s.yaml")
    assert "\n" not in str(info.value)


def test_pyxis_flags_are_argv_items_for_submitit_and_quoted_words_for_the_job_script() -> None:
    c = ContainerConfig(runtime=ContainerRuntime.PYXIS, image="/img/py torch.sqsh",
                        mounts=("/my data:/data",), flags=("--container-writable",))
    raw = ["--container-image=/img/py torch.sqsh", "--container-mounts=/my data:/data",
           "--container-writable"]
    assert render_container(c, ["-n", "2"], "python3") == (["-n", "2", *raw], "python3")
    assert render_container(c, ["-n", "2"], "python3", shell=True)[0] == [
        "-n", "2", "--container-image='/img/py torch.sqsh'",
        "--container-mounts='/my data:/data'", "--container-writable"]
