"""Prometheus textfile export, validated with prometheus_client's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcrun.observe.collect import collect_status
from hpcrun.observe.export import Metric, render_textfile, write_textfile
from tests.unit.observe.builders import make_run


def _samples(text: str) -> dict[str, tuple[dict[str, str], float]]:
    return {s.name: (s.labels, s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples}


def test_textfile_of_a_run_parses_with_the_expected_values(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    view = collect_status(run_dir, now=1070.0, rpo_s=600.0).view
    path = write_textfile(tmp_path / "textfile", view)
    assert path.name == "hpcrun_demo-1.prom"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    samples = _samples(path.read_text())
    assert samples["hpcrun_step"] == ({"run_id": "demo-1"}, 30.0)
    assert samples["hpcrun_step_rate"][1] == pytest.approx(0.5)
    assert samples["hpcrun_checkpoint_age_seconds"][1] == 10.0
    assert samples["hpcrun_restarts_total"][1] == 0.0
    assert samples["hpcrun_run_state"] == ({"run_id": "demo-1", "state": "RUNNING"}, 1.0)
    assert 0.0 < samples["hpcrun_ettr_ratio"][1] <= 1.0
    # 120 rank steps × 0.1 s of input wait over 150 s of step time
    assert samples["hpcrun_input_wait_ratio"][1] == pytest.approx(12.0 / 150.0)


def test_label_values_are_escaped() -> None:
    text = render_textfile([Metric(name="hpcrun_step", help="h", type="gauge", value=1.0)],
                           labels={"run_id": 'we"ird\\run\nx'})
    ((labels, value),) = _samples(text).values()
    assert labels == {"run_id": 'we"ird\\run\nx'} and value == 1.0


def test_metric_names_are_validated() -> None:
    with pytest.raises(ValueError):
        Metric(name="bad-name", help="h", type="gauge", value=1.0)
