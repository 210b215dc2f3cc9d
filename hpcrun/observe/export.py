"""Prometheus node_exporter textfile export (pure rendering + one atomic write).

node_exporter's textfile collector reads every ``*.prom`` file of a directory; a file must be
replaced atomically (write a temp name, rename) or the collector may read half of it.
Metric names follow Prometheus conventions: ``_seconds`` for durations, ``_total`` for counters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcrun.errors import ArgumentError
from hpcrun.observe.status import StatusView
from hpcrun.storage import LOCAL_STORAGE, Storage

_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, kw_only=True, slots=True)
class Metric:
    """One exported sample with its help text and type."""

    name: str
    """Metric name (``hpcrun_...``)."""
    help: str
    """One-line description."""
    type: str
    """``gauge`` or ``counter``."""
    value: float
    """Sample value."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of this sample besides the run's."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", self.name):
            raise ArgumentError(f"invalid Prometheus metric name {self.name!r}; expected "
                                "letters, digits, '_' and ':', not starting with a digit")
        if self.type not in ("gauge", "counter"):
            raise ArgumentError(f"metric type must be 'gauge' or 'counter', got "
                                f"{self.type!r}")


def metrics_from_status(view: StatusView) -> list[Metric]:
    """The exported metrics of a run (absent measurements are left out, not zeroed)."""
    f = view.facts
    m = [
        Metric(name="hpcrun_generation", help="Generation (fencing token) in force.",
               type="gauge", value=f.generation),
        Metric(name="hpcrun_steps_reported", help="1 when the ranks report steps; 0: steps "
               "not reported by the script (no step, token or ETTR figure is exported).",
               type="gauge", value=int(view.steps_reported)),
        Metric(name="hpcrun_restarts_total", help="In-allocation restarts.", type="counter",
               value=f.restarts),
        Metric(name="hpcrun_requeues_total", help="Requeues.", type="counter", value=f.requeues),
        Metric(name="hpcrun_run_state", help="1 for the run's current state.", type="gauge",
               value=1, labels={"state": f.state}),
        Metric(name="hpcrun_faults_total", help="Recorded faults.", type="counter",
               value=len(f.faults)),
    ]
    if view.steps_reported:
        m += [Metric(name="hpcrun_step", help="Last validated optimizer step.", type="gauge",
                     value=f.step),
              Metric(name="hpcrun_tokens_total", help="Tokens of validated steps.",
                     type="counter", value=f.tokens)]
    optional: list[tuple[str, str, float | None]] = [
        ("hpcrun_step_rate", "Optimizer steps per second (recent).", view.step_rate),
        ("hpcrun_ettr_ratio", "Productive / allocated time so far.", view.ettr),
        ("hpcrun_input_wait_ratio", "Input wait / step time (recent).",
         view.input_wait_ratio),
        ("hpcrun_checkpoint_age_seconds", "Age of the newest committed checkpoint (any tier).",
         min(view.checkpoint_age_s.values(), default=None)),
        ("hpcrun_rpo_exposure_seconds", "Age of the newest durable checkpoint.",
         view.rpo_exposure_s),
    ]
    fig = view.figures
    if fig is not None:  # the figures status and the report show, from the same function
        optional += [
            ("hpcrun_allocated_seconds", "Allocated gang seconds seen in the events.",
             fig.allocated_s),
            ("hpcrun_productive_seconds", "Allocated seconds charged to productive steps.",
             fig.productive_s if fig.steps_reported else None),
            ("hpcrun_input_wait_seconds", "Allocated seconds charged to input wait.",
             fig.input_wait_s if fig.input_wait_measured else None),
            ("hpcrun_tokens_per_allocated_second",
             "Accepted tokens per allocated gang second.", fig.tokens_per_allocated_s),
            ("hpcrun_tokens_per_productive_second",
             "Accepted tokens per productive second.", fig.tokens_per_productive_s),
        ]
    m += [Metric(name=n, help=h, type="gauge", value=v) for n, h, v in optional if v is not None]
    return m + training_metrics(view)


_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str) -> str:
    """The Prometheus name of a training metric: ``hpcrun_metric_`` + the name with every
    character outside ``[a-zA-Z0-9_]`` replaced by ``_``."""
    return "hpcrun_metric_" + _NAME_UNSAFE.sub("_", name)


def training_metrics(view: StatusView) -> list[Metric]:
    """One gauge per metric the steps report: its value at the newest step (the figure status
    shows); a name that sanitises to one already taken gets a numeric suffix."""
    out: list[Metric] = []
    taken: set[str] = set()
    for s in view.metrics.stats() if view.metrics is not None else ():
        name, n = metric_name(s.name), 2
        while name in taken:
            name, n = f"{metric_name(s.name)}_{n}", n + 1
        taken.add(name)
        out.append(Metric(name=name, type="gauge", value=s.last,
                          help=f"Training metric {s.name!r} at step {s.last_step} (the last "
                               "incarnation's value of a replayed step)."))
    return out


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render_textfile(metrics: list[Metric], *, labels: dict[str, str]) -> str:
    """The textfile-collector exposition text (pure)."""
    out: list[str] = []
    for metric in metrics:
        label_text = ",".join(f'{k}="{str(v).translate(_LABEL_ESCAPES)}"'
                              for k, v in sorted({**labels, **metric.labels}.items()))
        out += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}",
                f"{metric.name}{{{label_text}}} {_fmt(metric.value)}"]
    return "\n".join(out) + "\n"


def write_textfile(directory: Path, view: StatusView, *,
                   storage: Storage = LOCAL_STORAGE) -> Path:
    """Write ``hpcrun_<run_id>.prom`` into ``directory`` atomically; return its path."""
    labels = {"run_id": view.facts.run_id}
    text = render_textfile(metrics_from_status(view), labels=labels)
    path = Path(directory) / f"hpcrun_{_FILE_SAFE.sub('_', view.facts.run_id)}.prom"
    storage.makedirs(path.parent)
    storage.write_atomic(path, text.encode())
    return path
