"""The scale benchmark drives the real Checkpointer, and the harness writes results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.scale.__main__ import ScaleConfig, render, run_one
from benchmarks.scale.gang import SimulatedGang


def test_the_real_checkpointer_commits_and_restores_a_simulated_gang(tmp_path: Path) -> None:
    small = run_one(ScaleConfig(ranks=16, tensors=6), tmp_path / "a")
    large = run_one(ScaleConfig(ranks=128, tensors=6), tmp_path / "b")
    for row in (small, large):
        # rank 0 restored its own rows (checked in run_one) from its own shard only
        assert row["files_read_per_rank"] == 1 and row["bytes_read_per_rank"] > 0
        assert row["commit_s"] > 0 and row["restore_plan_s"] > 0
    assert small["bytes_read_per_rank"] == large["bytes_read_per_rank"]
    # metadata per rank stays constant as the gang grows (one shard, a share of a leader's)
    assert large["save_metadata_ops_per_rank"] <= small["save_metadata_ops_per_rank"]
    assert large["restore_metadata_ops_per_rank"] <= small["restore_metadata_ops_per_rank"]
    assert large["summary_wire_bytes"] > small["summary_wire_bytes"]
    # the counted targets hold on any machine; the timed ones (commit, planning, growth) are
    # the benchmark's to report, never a test's to assert on a loaded machine
    counted = [line for line in render([small, large]).splitlines()
               if line.startswith(("- save metadata ops", "- files opened"))]
    assert len(counted) == 2 and all(line.endswith(": met") for line in counted), counted
    assert "files opened per rank on restore: 1 shard" in counted[1]


def test_the_gang_never_gathers_across_all_ranks() -> None:
    gang = SimulatedGang(64, 8, 1)
    assert gang.node_ranks() == tuple(range(8)) and gang.num_nodes == 8
    with pytest.raises(NotImplementedError):
        gang.all_gather_object(1)


def test_results_are_written_as_json_and_markdown(tmp_path: Path) -> None:
    s = harness.Samples()
    for v in (3.0, 1.0, 2.0):
        s.add("x", v)
    assert s.median("x") == 2.0 and harness.ratio(4.0, s.median("x")) == 2.0
    assert harness.verdict(0.7, 0.8, at_least=True) == "NOT met"
    js, md = harness.write_results(s.values, "| a |", tmp_path)
    assert json.loads(js.read_text()) == {"x": [3.0, 1.0, 2.0]}
    assert md.read_text() == "| a |\n" and js.stem == md.stem


def test_the_rto_projection_adds_what_grows_with_the_gang_to_the_per_node_figures() -> None:
    from benchmarks.scale.rto import BUDGET_S, PER_NODE, project
    from hpcrun.runtime.node.membership import ALIVE_EVERY_S, NODE_STALE_ECHO_S, NODE_STALE_S

    measured = {"store_rendezvous": [(16, 0.01), (1024, 0.5)],
                "store_server_cpu": [(256, 200e-6), (1024, 100e-6)],
                "hop_latency_s": 10e-6, "liveness_nodes": 100, "liveness_read_s": 0.002}
    big, small = project(measured, ranks=16384), project(measured, ranks=64)
    assert list(big["phases"]) == list(BUDGET_S) and big["nodes"] == 2048
    start = big["phases"]["start"]
    # 150 µs of store server time per rank (the median of the two), a ring of 16,383 hops
    assert start["grows_s"] == pytest.approx(PER_NODE.groups_s + 16384 * 150e-6 + 16383 * 10e-6)
    assert big["phases"]["detect"]["per_node_s"] == pytest.approx(
        NODE_STALE_S + ALIVE_EVERY_S + PER_NODE.detect_extra_s)
    assert big["phases"]["detect"]["grows_s"] == 0.0, "beats over the network: no file read"
    assert big["total_s"] == pytest.approx(sum(p["total_s"] for p in big["phases"].values()))
    assert small["phases"]["start"]["total_s"] < start["total_s"]
    echo = project(measured, ranks=16384, echo=True)
    assert big["total_s"] - echo["total_s"] == pytest.approx(NODE_STALE_S - NODE_STALE_ECHO_S)


def test_a_restarts_metadata_operations_are_charged_at_the_servers_rate() -> None:
    from benchmarks.scale.rto import MDS_OPS_S, project

    measured = {"store_rendezvous": [(16, 0.01)], "store_server_cpu": [(256, 1e-6)],
                "hop_latency_s": 1e-6, "liveness_nodes": 100, "liveness_read_s": 0.002}
    plain = project(measured, ranks=16384)["phases"]
    counted = project({**measured, "metaops": {"restart_per_rank": 3.4,
                                               "swap_decision_ops": 86}}, ranks=16384)
    restore, swap = counted["phases"]["restore"], counted["phases"]["swap"]
    assert restore["grows_s"] - plain["restore"]["grows_s"] == pytest.approx(
        3.4 * 16384 / MDS_OPS_S)
    assert swap["grows_s"] == pytest.approx(86 / MDS_OPS_S)
    assert counted["but_restore_s"] == pytest.approx(counted["total_s"] - restore["total_s"])


def test_a_measured_gloo_fit_raises_the_start_phase_when_it_outgrows_the_store_model() -> None:
    from benchmarks.scale.gloo import fit
    from benchmarks.scale.rto import project

    log_shaped = [{"ranks": n, "init_s": 0.05 + 0.02 * math.log2(n),
                   "allreduce_s": 0.001} for n in (2, 4, 8, 16)]
    linear = [{"ranks": n, "init_s": 0.05 + 0.01 * n, "allreduce_s": 0.0} for n in (2, 4, 8, 16)]
    assert fit(log_shaped)["best"] == "log"
    assert fit(linear)["best"] == "linear"
    assert fit(linear, at=16384)["projected_s"] == pytest.approx(0.05 + 0.01 * 16384)
    measured = {"store_rendezvous": [(16, 0.01)], "store_server_cpu": [(256, 1e-6)],
                "hop_latency_s": 1e-6, "liveness_nodes": 100, "liveness_read_s": 0.002}
    plain = project(measured, ranks=16384)["phases"]["start"]["grows_s"]
    # the groups connect lazily and agree in log2 n rounds: the projection takes the log fit
    grown = project({**measured, "gloo": log_shaped}, ranks=16384)["phases"]["start"]
    assert grown["grows_s"] == pytest.approx(max(plain, 0.05 + 0.001 + 0.02 * 14))
    assert grown["grows_s"] > plain and "log fit" in grown["how"]


def test_metadata_counts_drop_with_the_follower_the_heartbeat_and_the_nodes_log_copy() -> None:
    from benchmarks.scale import metaops

    result = metaops.run([64, 128], tensors=2)
    small, big = result["rows"]
    assert small["steady_per_node_s"] < small["steady_before_per_node_s"] / 3
    # the cadence, the restore and the partner-copy lookup read the agent's copy alone
    assert result["log_reads"]["seeded_total"] == 0
    rates = result["rates"]
    assert rates["heartbeat"] < rates["heartbeat_stalled"] / 4  # 30 s while all ranks step
    assert big["steady_spares_total_s"] < big["steady_spares_silent_total_s"]
    assert result["log_reads"]["cold_first"] >= metaops.LOG_ENTRIES
    assert small["restart_per_rank"] < small["restart_before_per_rank"] / 10
    assert big["steady_total_s"] == pytest.approx(
        small["steady_total_s"] + 8 * small["steady_per_node_s"])  # per node x nodes
    assert "steady load at 16 nodes" in metaops.render(result)
