"""Silent data corruption's pure core: replica majority, suspect losses, replay verdicts, the
canary's stored answer, and what the supervisor decides about an ``sdc`` fault."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from hpcrun.control.record import RunRecord
from hpcrun.control.spec import RetryPolicy
from hpcrun.errors import ArgumentError
from hpcrun.runtime.incarnation import Ending
from hpcrun.runtime.rank.sdc import (
    CANARY_ANSWER,
    RankResult,
    Verdict,
    canary_answer_of,
    canary_operands,
    judge,
    loss_bits,
    loss_suspect,
    odd_replicas,
    replica_groups,
)
from hpcrun.runtime.supervise.decide import (
    DecisionPolicy,
    GangFault,
    Observations,
    Requeue,
    RestartInAllocation,
    decide,
)
from hpcrun.vocab import FaultClass

NODE = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}
ALL4 = replica_groups(4)


def res(rank: int, fp: str, *losses: float) -> RankResult:
    return RankResult(rank=rank, node=NODE[rank], fingerprint=fp,
                      losses=tuple(loss_bits(x) for x in losses))


# -- replica agreement ---------------------------------------------------------------------------

def test_the_odd_replica_is_named_by_majority() -> None:
    assert odd_replicas({0: "a", 1: "a", 2: "b", 3: "a"}, ALL4) == ((2,), True)
    assert odd_replicas({0: "a", 1: "a", 2: "a", 3: "a"}, ALL4) == ((), True)


def test_two_replicas_that_differ_are_both_suspect() -> None:
    assert odd_replicas({0: "a", 1: "b"}, replica_groups(2)) == ((0, 1), False)


def test_replicas_are_compared_within_their_shard_group_only() -> None:
    groups = replica_groups(4, [[0, 2], [1, 3]])  # two shards, two replicas each
    assert odd_replicas({0: "a", 2: "a", 1: "x", 3: "x"}, groups) == ((), True)
    assert odd_replicas({0: "a", 2: "b", 1: "x", 3: "x"}, groups) == ((0, 2), False)


def test_replica_groups_must_partition_the_ranks() -> None:
    with pytest.raises(ArgumentError, match="each rank once"):
        replica_groups(4, [[0, 1], [1, 2, 3]])
    with pytest.raises(ArgumentError, match=r"0\.\.3"):
        replica_groups(4, [[0, 1]])


def test_agreeing_replicas_without_a_replay_are_an_agreement() -> None:
    assert judge([res(r, "a") for r in range(4)], None, ALL4).verdict is Verdict.AGREE


def test_a_majority_without_a_replay_names_the_odd_node() -> None:
    j = judge([res(0, "a"), res(1, "a"), res(2, "a"), res(3, "b")], None, ALL4)
    assert (j.verdict, j.ranks, j.nodes) == (Verdict.HARDWARE, (3,), ("n1",))


def test_two_replicas_without_a_replay_are_unresolved() -> None:
    j = judge([res(0, "a"), res(2, "b")], None, ((0, 2),))
    assert (j.verdict, j.nodes) == (Verdict.UNRESOLVED, ("n0", "n1"))
    assert "ctx.run_step" in j.detail


# -- replay verdicts -----------------------------------------------------------------------------

def test_a_transient_flip_is_traced_to_the_rank_that_deviated_first() -> None:
    # Rank 2's parameters were flipped after step 11: its loss at step 12 differs from the
    # replay, and the wrong gradient reached every replica one step later.
    observed = [res(0, "x", 1.0, 0.9, 0.7), res(2, "y", 1.0, 0.95, 0.8)]
    replayed = [res(0, "g", 1.0, 0.9, 0.8), res(2, "g", 1.0, 0.9, 0.8)]
    j = judge(observed, replayed, ((0, 2),), steps=(11, 12, 13))
    assert (j.verdict, j.ranks, j.nodes, j.step) == (Verdict.HARDWARE, (2,), ("n1",), 12)


def test_a_flip_after_the_last_forward_shows_only_in_the_parameters() -> None:
    observed = [res(0, "g", 1.0, 0.9), res(2, "y", 1.0, 0.9)]
    replayed = [res(0, "g", 1.0, 0.9), res(2, "g", 1.0, 0.9)]
    j = judge(observed, replayed, ((0, 2),), steps=(11, 12))
    assert (j.verdict, j.ranks, j.step) == (Verdict.HARDWARE, (2,), None)


def test_a_device_wrong_again_on_replay_is_named_by_the_replay_majority() -> None:
    observed = [res(0, "g", 1.0), res(1, "g", 1.0), res(3, "w", 1.0)]
    replayed = [res(0, "g", 1.0), res(1, "g", 1.0), res(3, "w2", 1.0)]
    j = judge(observed, replayed, ((0, 1, 3),), steps=(5,))
    assert (j.verdict, j.ranks, j.nodes) == (Verdict.HARDWARE, (3,), ("n1",))


def test_a_nan_that_replays_to_the_same_nan_is_the_data_or_the_model() -> None:
    nan = float("nan")
    observed = [res(0, "a", 1.0, nan), res(2, "a", 1.0, nan)]
    replayed = [res(0, "a", 1.0, nan), res(2, "a", 1.0, nan)]
    j = judge(observed, replayed, ((0, 2),), steps=(7, 8))
    assert (j.verdict, j.ranks) == (Verdict.DETERMINISTIC, ())


def test_replicas_that_diverge_the_same_way_twice_are_the_model_with_two_replicas() -> None:
    observed = [res(0, "a", 1.0), res(2, "b", 1.0)]
    j = judge(observed, list(observed), ((0, 2),), steps=(3,))
    assert j.verdict is Verdict.DETERMINISTIC and "rank-dependent" in j.detail


# -- suspect losses ------------------------------------------------------------------------------

def test_non_finite_losses_are_always_suspect() -> None:
    assert loss_suspect(float("nan"), [], None) == "loss is nan"
    assert loss_suspect(float("inf"), [1.0] * 10, 4.0) == "loss is inf"


def test_a_spike_is_judged_against_the_recent_mean_once_there_is_history() -> None:
    assert loss_suspect(50.0, [2.0] * 4, 4.0) == ""  # too little history
    assert "above 4 x the recent mean 2" in loss_suspect(9.0, [2.0] * 10, 4.0)
    assert loss_suspect(7.9, [2.0] * 10, 4.0) == ""
    assert loss_suspect(9.0, [2.0] * 10, None) == ""  # spike check off


def test_loss_bits_compare_nan_equal_and_tell_neighbouring_floats_apart() -> None:
    assert loss_bits(float("nan")) == loss_bits(float("nan"))
    assert loss_bits(1.0) != loss_bits(np.nextafter(1.0, 2.0))


# -- canary ----------------------------------------------------------------------------------------

def test_the_stored_canary_answer_is_the_exact_integer_product() -> None:
    a, b = canary_operands()
    assert canary_answer_of(a @ b) == CANARY_ANSWER
    assert np.abs(a @ b).max() < 2 ** 11  # exact in fp16 as well as fp32
    wrong = a @ b
    wrong[3, 5] += 1
    assert canary_answer_of(wrong) != CANARY_ANSWER


# -- the supervisor's decision ---------------------------------------------------------------------

POLICY = DecisionPolicy(retry=RetryPolicy(jitter=False, backoff_base_s=10, backoff_cap_s=60),
                        max_requeues=5, spare_nodes=0)
RECORD = RunRecord(run_id="r", spec_id="s", generation=4, holder="h")


def _obs(fault: GangFault) -> Observations:
    return Observations(generation=4, attempt=0, nodes=("n0", "n1"), waited_s=60.0,
                        exits={"n0": Ending.FAILED, "n1": Ending.FAILED}, faults=(fault,),
                        preempt_signal=int(signal.SIGUSR1))


def test_sdc_on_a_named_node_requeues_without_it_and_rolls_back() -> None:
    fault = GangFault(fault=FaultClass.SDC, node="n1", rank=3, step=18, signature="sdc:n1")
    d = decide(_obs(fault), RECORD, POLICY, now=1000.0)
    assert isinstance(d, Requeue) and d.rollback and d.exclude == ("n1",)
    assert "known-good" in d.reason


def test_unresolved_sdc_restarts_in_the_allocation_and_rolls_back() -> None:
    fault = GangFault(fault=FaultClass.SDC, signature="sdc:unresolved", step=18)
    d = decide(_obs(fault), RECORD, POLICY, now=1000.0)
    assert isinstance(d, RestartInAllocation) and d.rollback


def test_other_faults_do_not_roll_back() -> None:
    fault = GangFault(fault=FaultClass.PROCESS_CRASH, node="n1", rank=3, step=7,
                      signature="process_crash:rank3:-9")
    d = decide(_obs(fault), RECORD, POLICY, now=1000.0)
    assert isinstance(d, RestartInAllocation) and not d.rollback


def test_the_replica_far_from_its_replay_is_the_origin_when_losses_do_not_tell() -> None:
    # A flip too small to change a rounded loss still changes the shared gradient: the other
    # replica's loss moves first, but its parameters drift from the replay only slightly.
    observed = [res(0, "x", 1.0, 0.9), res(2, "y", 1.0, 0.8)]
    replayed = [RankResult(rank=0, node="n0", fingerprint="g", losses=(
        *observed[0].losses[:1], loss_bits(0.85)), distance=1e-7),
                RankResult(rank=2, node="n1", fingerprint="g", losses=observed[1].losses,
                           distance=0.02)]
    j = judge(observed, replayed, ((0, 2),), steps=(18, 19))
    assert (j.verdict, j.ranks, j.nodes) == (Verdict.HARDWARE, (2,), ("n1",))
