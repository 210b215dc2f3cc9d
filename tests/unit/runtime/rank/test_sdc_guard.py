"""The SDC guard inside one rank, on CPU: device fingerprints, the known-answer canary, and the
replay of a suspect window (a transient flip is hardware; a NaN batch is the data: fail naming
the batch, or skip it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hpcrun.control.entries import BatchSkippedNote, FaultPayload
from hpcrun.control.spec import SdcPolicy
from hpcrun.errors import NonFiniteError, SdcEchoError, SdcError
from hpcrun.runtime.faults import flip_bit, parse_injections
from hpcrun.runtime.rank import sdc_guard
from hpcrun.runtime.rank.sdc import CANARY_ANSWER
from hpcrun.runtime.rank.sdc_guard import SdcGuard, fingerprint, run_canary
from hpcrun.testing import FakeClock
from hpcrun.vocab import FaultClass, SdcAction
from tests.unit.runtime.rank.sdc_fakes import RecordingEvents, RecordingLog


def _guard(**policy: Any) -> tuple[SdcGuard, RecordingLog]:
    log = RecordingLog()
    guard = SdcGuard(policy=SdcPolicy(**policy), rank=0, node="n0", world_size=1,
                     log=log, incarnation=SimpleNamespace(generation=1, holder="h"),  # type: ignore[arg-type]
                     events=RecordingEvents(), clock=FakeClock(), device="cpu")  # type: ignore[arg-type]
    return guard, log


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _batches(n: int, nan_at: int | None = None) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for k in range(n):
        x = torch.randn(8, 4, generator=g)
        if k == nan_at:
            x[0, 0] = float("nan")
        out.append({"x": x, "y": x.sum(dim=1, keepdim=True), "batch": k})
    return out


def _step_fn(model: torch.nn.Module, optim: torch.optim.Optimizer) -> Any:
    def step(batch: dict[str, Any]) -> float:
        loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        return float(loss.item())
    return step


def _train(guard: SdcGuard, batches: list[dict[str, Any]], model: torch.nn.Module,
           optim: torch.optim.Optimizer, *, flip_after: int | None = None) -> None:
    guard.start({"model": model, "optim": optim})
    fn = _step_fn(model, optim)
    for step, batch in enumerate(batches):
        guard.at_boundary(step, suspect=bool(guard.suspect))
        loss = guard.run_step(fn, batch, step)
        guard.observe_loss(loss, step + 1)
        if flip_after == step + 1:
            guard.inject(bit=30)  # an exponent bit: the next loss explodes
    guard.at_boundary(len(batches), suspect=bool(guard.suspect))


# -- fingerprints and canary ---------------------------------------------------------------------

def test_one_flipped_bit_changes_the_fingerprint_and_equal_bytes_do_not() -> None:
    a = [torch.linspace(-1, 1, 1000), torch.arange(10), torch.ones(3, dtype=torch.float16),
         torch.tensor([True, False])]
    b = [t.clone() for t in a]
    assert fingerprint(a) == fingerprint(b)
    for i, bit in ((0, 0), (1, 5), (2, 15), (3, 0)):
        c = [t.clone() for t in a]
        flip_bit(c[i], index=1, bit=bit)
        assert fingerprint(c) != fingerprint(a), (i, bit)


def test_a_correct_cpu_passes_the_canary_and_a_wrong_answer_is_an_sdc_fault(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_canary("cpu") == CANARY_ANSWER
    guard, _ = _guard()
    guard.canary()
    monkeypatch.setattr(sdc_guard, "run_canary", lambda device: CANARY_ANSWER + 1)
    with pytest.raises(SdcError, match="failed the known-answer canary"):
        guard.canary()


def test_the_sdc_injection_parses() -> None:
    [inj] = parse_injections("sdc@step=17,rank=1")
    assert (inj.kind.value, inj.step, inj.rank) == ("sdc", 17, 1)


# -- replay verdicts -----------------------------------------------------------------------------

def test_a_transient_flip_replays_clean_and_is_an_sdc_fault_naming_the_node() -> None:
    guard, log = _guard(loss_spike=4.0, every_steps=100)
    model, optim = _model()
    with pytest.raises(SdcEchoError, match="silent data corruption"):
        _train(guard, _batches(10), model, optim, flip_after=7)
    [fault] = [e for e in log.entries if isinstance(e, FaultPayload)]
    assert (fault.fault, fault.node, fault.rank, fault.step) == (FaultClass.SDC, "n0", 0, 8)


def test_a_nan_batch_that_replays_the_same_fails_naming_the_batch() -> None:
    guard, log = _guard(every_steps=100)
    model, optim = _model()
    with pytest.raises(NonFiniteError, match=r"step 4 \(batch 3\).*not finite again"):
        _train(guard, _batches(6, nan_at=3), model, optim)
    assert not [e for e in log.entries if isinstance(e, FaultPayload)]  # not the hardware


def test_skip_batch_drops_the_nan_step_and_logs_it() -> None:
    guard, log = _guard(every_steps=100, policy=SdcAction.SKIP_BATCH)
    model, optim = _model()
    batches = _batches(6, nan_at=3)
    _train(guard, batches, model, optim)
    assert [(e.step, e.batch) for e in log.entries if isinstance(e, BatchSkippedNote)] == [
        (4, "3")]
    # The same as training without batch 3 (its data stays consumed).
    ref_model, ref_optim = _model()
    fn = _step_fn(ref_model, ref_optim)
    for k, batch in enumerate(batches):
        if k != 3:
            fn(batch)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 ref_model.state_dict().values(), strict=True))


def test_checks_off_leave_the_step_alone() -> None:
    guard, log = _guard(enabled=False)
    model, optim = _model()
    _train(guard, _batches(4, nan_at=1), model, optim)
    assert log.entries == [] and not guard.suspect


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_fingerprints_on_the_device_as_the_cpu_does_and_passes_the_canary() -> None:
    params = [torch.linspace(-1, 1, 4096).to(torch.bfloat16), torch.randn(64, 64)]
    assert fingerprint([p.cuda() for p in params]) == fingerprint(params)
    assert run_canary("cuda") == CANARY_ANSWER
