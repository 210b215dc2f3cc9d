"""How a dtype is stored, known without torch, agrees with torch's own answer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hpcrun.checkpoint.keys import stored_as
from hpcrun.checkpoint.stage import dtype_name, storage_dtype
from hpcrun.errors import CheckpointError

_DTYPES = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_every_torch_dtype_is_stored_as_torch_says(dtype: torch.dtype) -> None:
    try:
        expected = storage_dtype(dtype)
    except (CheckpointError, RuntimeError, TypeError):
        return  # not storable (quantized, bits): the name path refuses it through torch too
    assert stored_as(dtype_name(dtype)) == expected


def test_the_drain_process_never_imports_torch() -> None:
    code = ("import sys\nimport hpcrun.runtime.node.drainer as d\n"
            "from hpcrun.checkpoint.drain import drain_to_tier1\n"
            "from hpcrun.checkpoint.shards import read_shard\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
