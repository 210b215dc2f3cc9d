"""The image this node's ranks start in: binds from the run's paths, argv through the runtime."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpcrun.control.spec import RunSpec
from hpcrun.launch.container import HOST_DIGEST_ENV, ContainerConfig, ContainerRuntime
from hpcrun.runtime.node.image import rank_argv, rank_image


def _spec(manifest: Path | None = None) -> RunSpec:
    data = {"manifest": str(manifest)} if manifest else {}
    return RunSpec.from_dict({"name": "t", "entrypoint": "m:f", "data": data})


def test_ranks_start_in_the_image_with_the_runs_paths_bound(tmp_path: Path) -> None:
    ch = ContainerConfig(runtime=ContainerRuntime.CHARLIECLOUD, image="/img",
                         mounts=("/scratch:/scratch",))
    image = rank_image(ch, _spec(), run_dir=tmp_path / "run", node_local_root=tmp_path / "nl",
                       environ={"HPCRUN_CODE_PATH": "/code"}, python=sys.executable)
    assert image is not None and image.python == sys.executable
    for path in (tmp_path / "run", tmp_path / "nl", Path("/code"), Path(sys.base_prefix)):
        assert any(b.startswith(f"{path.resolve()}:") or b.startswith(f"{path}:")
                   or str(path.resolve()).startswith(b.split(":")[0] + "/")
                   for b in image.binds), (path, image.binds)
    assert image.binds[0] == "/scratch:/scratch" and HOST_DIGEST_ENV in image.env
    argv = rank_argv(image, "/host/python", ["-m", "hpcrun.runtime.rank.worker"])
    assert argv[:1] == ["ch-run"] and argv[-4:] == ["--", sys.executable, "-m",
                                                    "hpcrun.runtime.rank.worker"]
    assert "--cd=/code" in argv


def test_an_image_with_its_own_interpreter_binds_no_host_environment(tmp_path: Path) -> None:
    manifest = tmp_path / "data" / "manifest.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"sources": []}))
    app = ContainerConfig(runtime=ContainerRuntime.APPTAINER, image="/i.sif", python="python3")
    image = rank_image(app, _spec(manifest), run_dir=tmp_path / "run", node_local_root=None,
                       environ={}, python=sys.executable)
    assert image is not None and image.python == "python3"
    assert image.binds == (f"{tmp_path.resolve()}/data:{tmp_path.resolve()}/data",
                           f"{tmp_path.resolve()}/run:{tmp_path.resolve()}/run")
    assert rank_argv(image, sys.executable, ["-m", "w"])[-3:] == ["python3", "-m", "w"]


def test_ranks_run_on_the_host_without_a_container_or_under_pyxis(tmp_path: Path) -> None:
    pyxis = ContainerConfig(runtime=ContainerRuntime.PYXIS, image="nvcr.io#x")
    for c in (None, pyxis):
        assert rank_image(c, _spec(), run_dir=tmp_path, node_local_root=None, environ={},
                          python="py") is None
    assert rank_argv(None, "py", ["-m", "w"]) == ["py", "-m", "w"]
    assert rank_argv(None, "py", ["./train.sh", "1"]) == ["./train.sh", "1"]
