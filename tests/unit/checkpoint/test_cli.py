"""`hpcrun ckpt ls | verify | gc` on a real run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.cli.main import main

from .conftest import trained


def _save_two(incarnation) -> list[str]:
    ck = incarnation()
    ids = []
    for step in (1, 2):
        model, opt = trained(step)
        ids.append(ck.save(step, {"model": model, "optim": opt}, blocking=True).ckpt_id)
    return ids


def test_ls_and_verify_ok(run_dir: Path, incarnation, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    ids = _save_two(incarnation)
    main(["ckpt", "ls", str(run_dir)])
    out = capsys.readouterr().out
    assert all(i[:16] in out for i in ids) and "shared" in out
    main(["ckpt", "verify", str(run_dir)])
    out = capsys.readouterr().out
    assert out.count("] ok") == 2 and "2 copies of 2 checkpoints: 2 ok" in out


def test_verify_fails_on_a_flipped_byte(run_dir: Path, incarnation, capsys) -> None:
    ids = _save_two(incarnation)
    [shard] = (run_dir / "ckpt" / ids[1]).rglob("rank-*.h5")
    data = bytearray(shard.read_bytes())
    data[len(data) * 2 // 3] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exit_info:
        main(["ckpt", "verify", str(run_dir), ids[1]])
    assert exit_info.value.code != 0
    assert "fails its" in capsys.readouterr().out


def test_gc_dry_run_lists_debris(run_dir: Path, incarnation, capsys) -> None:
    _save_two(incarnation)
    (run_dir / "ckpt" / "g000009-s0000000001-abc").mkdir()
    main(["ckpt", "gc", str(run_dir), "--older-than", "-1", "--dry-run"])
    assert "would remove debris g000009-s0000000001-abc" in capsys.readouterr().out
    assert (run_dir / "ckpt" / "g000009-s0000000001-abc").exists()


def test_diff_says_identical_for_the_same_state_and_names_a_differing_tensor(
        run_dir: Path, incarnation, capsys) -> None:
    first, second = _save_two(incarnation)
    with pytest.raises(SystemExit) as same:
        main(["ckpt", "diff", str(run_dir), str(run_dir), "--ckpt-a", second])
    assert same.value.code == 0 and capsys.readouterr().out.strip().endswith("identical")
    with pytest.raises(SystemExit) as differ:
        main(["ckpt", "diff", str(run_dir), str(run_dir), "--ckpt-a", first])
    out = capsys.readouterr().out
    assert differ.value.code == 1
    assert "tensor 'model/" in out and "differs" in out and "step 1" in out
