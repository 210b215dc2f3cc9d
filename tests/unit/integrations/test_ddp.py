"""hpcrun.integrations.ddp: the DDP arguments each contract gets."""

from __future__ import annotations

import pytest
import torch

from hpcrun.errors import SpecError
from hpcrun.integrations.ddp import ddp_kwargs
from hpcrun.vocab import ResumeContract

CPU = torch.device("cpu")


def test_bitwise_keeps_one_bucket_layout() -> None:
    assert ddp_kwargs(ResumeContract.BITWISE, CPU) == {"find_unused_parameters": True,
                                                       "static_graph": False}


@pytest.mark.parametrize("contract", [c for c in ResumeContract if c is not ResumeContract.BITWISE])
def test_weaker_contracts_keep_torchs_defaults(contract: ResumeContract) -> None:
    assert ddp_kwargs(contract, CPU) == {}
    assert ddp_kwargs(contract, CPU, static_graph=True) == {"static_graph": True}


def test_a_cuda_rank_names_its_device_and_the_callers_arguments_pass_through() -> None:
    got = ddp_kwargs(ResumeContract.BITWISE, torch.device("cuda", 3), bucket_cap_mb=50)
    assert got["device_ids"] == [3] and got["bucket_cap_mb"] == 50
    assert got["find_unused_parameters"] is True


@pytest.mark.parametrize("arg", [{"static_graph": True}, {"find_unused_parameters": False}])
def test_bitwise_refuses_arguments_that_rebuild_the_buckets(arg: dict[str, bool]) -> None:
    with pytest.raises(SpecError, match=r"rebuild the gradient buckets.*exact-order") as err:
        ddp_kwargs(ResumeContract.BITWISE, CPU, **arg)
    assert str(next(iter(arg))) in str(err.value)


def test_status_can_name_a_plain_ddp_that_rebuilds_and_not_the_helpers(tmp_path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hpcrun.runtime.rank.context import rebuilding_ddp

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        plain = DistributedDataParallel(torch.nn.Linear(3, 2))
        fixed = DistributedDataParallel(torch.nn.Linear(3, 2),
                                        **ddp_kwargs(ResumeContract.BITWISE, CPU))
        static = DistributedDataParallel(torch.nn.Linear(3, 2), static_graph=True)
        assert rebuilding_ddp({"model": plain, "fixed": fixed, "optim": object()}) == ("model",)
        assert rebuilding_ddp({"a": static, "b": fixed}) == ("a",)
        assert rebuilding_ddp({"model": torch.nn.Linear(3, 2)}) == ()
    finally:
        dist.destroy_process_group()
