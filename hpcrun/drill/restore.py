"""The restore drill: ``hpcrun drill --restore RUN``.

For the newest committed checkpoint and an older one, restore into every supported layout (the
saved world size, half and double) through the checkpoint plane's own path (manifest digest,
per-shard checksums, gather plan, reshard rules), and validate the first step after it: every
rank of the new layout holds byte-identical replicated state, its meta tree (RNG, data cursor)
comes from old rank ``r % N``, and the next global batch is the same on every layout
(exact-order). Then show that a truncated manifest, a bit-flipped manifest and a bit-flipped
shard are each rejected with one clear line. Nothing in the run directory is modified: the
damage is done to copies in a scratch directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcrun.drill.contracts import ContractResult
from hpcrun.drill.states import CheckpointState, committed, load_state
from hpcrun.errors import CorruptCheckpointError, HpcrunError, ReshardError

Check = ContractResult
"""A named check with a verdict and one line of detail."""


def layouts(world_size: int) -> list[int]:
    """Restore layouts to try for a checkpoint written by ``world_size`` ranks (pure)."""
    out = [world_size]
    if world_size % 2 == 0:
        out.append(world_size // 2)
    out.append(world_size * 2)
    return out


def cursor_position(meta: Any) -> Any:
    """The data cursor's position (next global batch, mixture counts) in a meta tree (pure)."""
    data = meta.get("data") if isinstance(meta, dict) else None
    state = data.get("state") if isinstance(data, dict) else None
    return state.get("position") if isinstance(state, dict) else None


def _next_batch(meta: Any) -> str:
    pos = cursor_position(meta)
    return str(pos.get("batch")) if isinstance(pos, dict) else "?"


def validate_layout(saved: CheckpointState, got: CheckpointState) -> list[str]:
    """Problems in ``got`` (restored onto M ranks) relative to ``saved`` (N ranks) (pure)."""
    problems = []
    ref = saved.ranks[0]
    for rs in got.ranks:
        old = saved.ranks[rs.rank % saved.world_size]
        for key, raw in old.tensors.items():
            if key in ref.tensors and rs.tensors.get(key) != raw:
                problems.append(f"rank {rs.rank}: tensor {key!r} differs after reshard")
        if json.dumps(rs.meta, sort_keys=True) != json.dumps(old.meta, sort_keys=True):
            problems.append(f"rank {rs.rank}: meta tree is not old rank "
                            f"{rs.rank % saved.world_size}'s")
    batches = {json.dumps(cursor_position(r.meta), sort_keys=True) for r in got.ranks}
    if len(batches) > 1:
        problems.append(f"ranks disagree on the next global batch: {sorted(batches)[:2]}")
    return problems[:5]


def _restore_checks(run_dir: Path, ckpt: Any, label: str) -> list[Check]:
    try:
        saved = load_state(run_dir, ckpt)
    except (HpcrunError, OSError) as exc:
        return [Check(name=f"{label} verify", ok=False, detail=str(exc)[:200])]
    out = [Check(name=f"{label} verify", ok=True,
                 detail=f"{ckpt.ckpt_id} step {saved.step}, {saved.world_size} ranks, "
                        f"{len(saved.ranks[0].tensors)} tensors")]
    for m in layouts(saved.world_size):
        name = f"{label} → {m} ranks"
        try:
            got = load_state(run_dir, ckpt, world_size=m)
        except ReshardError as exc:
            out.append(Check(name=name, ok=None, detail=f"unsupported layout: {exc}"[:200]))
            continue
        except (HpcrunError, OSError) as exc:
            out.append(Check(name=name, ok=False, detail=str(exc)[:200]))
            continue
        problems = validate_layout(saved, got)
        out.append(Check(name=name, ok=not problems, detail="; ".join(problems) or
                         f"every rank restored; next batch "
                         f"{_next_batch(got.ranks[0].meta)} on all ranks"))
    return out


def _damage_copy(run_dir: Path, ckpt: Any, scratch: Path,
                 damage: Callable[[Path], None]) -> Path:
    """Copy ``ckpt``'s directory into a scratch run dir and damage the copy."""
    src = run_dir / "ckpt" / ckpt.ckpt_id
    dst = scratch / "ckpt" / ckpt.ckpt_id
    shutil.rmtree(scratch / "ckpt", ignore_errors=True)
    shutil.copytree(src, dst)
    damage(dst)
    return scratch


def truncate_manifest(ckpt_dir: Path) -> None:
    path = ckpt_dir / "manifest.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_manifest(ckpt_dir: Path) -> None:
    _flip(ckpt_dir / "manifest.json", 0.5)


def flip_shard(ckpt_dir: Path) -> None:
    """One bit flipped in the middle of the first shard's largest tensor (its bytes, not the
    file's HDF5 metadata or free space, which no checksum covers)."""
    import h5py

    shard = sorted(ckpt_dir.rglob("*.h5"))[0]
    extents: list[tuple[int, int]] = []
    with h5py.File(shard, "r") as f:
        f.visititems(lambda _, obj: extents.append(
            (obj.id.get_storage_size(), obj.id.get_offset()))
            if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None else None)
    size, offset = max(extents)
    data = bytearray(shard.read_bytes())
    data[offset + size // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def remove_shard(ckpt_dir: Path) -> None:
    sorted(ckpt_dir.rglob("*.h5"))[-1].unlink()


def _flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGES: tuple[tuple[str, Callable[[Path], None]], ...] = (
    ("reject truncated manifest", truncate_manifest),
    ("reject bit-flipped manifest", flip_manifest),
    ("reject bit-flipped shard", flip_shard),
    ("reject missing shard", remove_shard),
)


def _rejection_checks(run_dir: Path, ckpt: Any) -> list[Check]:
    out = []
    with tempfile.TemporaryDirectory(prefix="hpcrun-restore-drill-") as tmp:
        for name, damage in DAMAGES:
            scratch = _damage_copy(run_dir, ckpt, Path(tmp), damage)
            try:
                load_state(scratch, ckpt)
            except CorruptCheckpointError as exc:
                msg = str(exc)
                one_line = "\n" not in msg and len(msg) < 400
                out.append(Check(name=name, ok=one_line, detail=msg[:160]))
                continue
            except (HpcrunError, OSError, ValueError) as exc:
                out.append(Check(name=name, ok=False, detail=f"rejected with "
                                 f"{type(exc).__name__}, not CorruptCheckpointError: {exc}"[:160]))
                continue
            out.append(Check(name=name, ok=False, detail="damaged copy was accepted"))
    return out


def restore_drill(run_dir: Path) -> list[Check]:
    """All restore-drill checks for ``run_dir`` (reads the run; writes only scratch copies)."""
    found = committed(run_dir)
    if not found:
        return [Check(name="committed checkpoints", ok=False,
                      detail=f"run {run_dir.name} has none; run it past its first commit")]
    present = [c for c in found if "shared" in c.tiers and (run_dir / c.manifest).exists()]
    if not present:
        return [Check(name="committed checkpoints", ok=False,
                      detail="no committed checkpoint is on the shared tier")]
    out = [Check(name="committed checkpoints", ok=True,
                 detail=f"{len(found)} committed, {len(present)} on the shared tier")]
    out += _restore_checks(run_dir, present[-1], "latest")
    if len(present) > 1:
        out += _restore_checks(run_dir, present[-2], "older")
    else:
        out.append(Check(name="older", ok=None, detail="only one committed checkpoint kept"))
    out += _rejection_checks(run_dir, present[-1])
    return out
