"""``hpcrun.lite``: step-boundary stops, exact commits and true figures for a plain script.

A script run in script mode (``script:`` in run.yaml, :mod:`hpcrun.runtime.rank.script`) keeps its
own loop and its own ``init_process_group``; four calls give it what ``main(ctx)`` gets::

    import hpcrun.lite as lite

    dist.init_process_group("gloo")                 # the script's own default group
    start = lite.restore({"model": model, "optim": optim})
    for step in range(start, steps):
        if lite.should_stop():                      # a preemption: committed here, leave
            break
        loss = train_one_step()
        lite.report(step + 1, loss=loss.item())     # status, ETTR and the step events
    lite.save()                                     # the final commit

- :func:`restore` registers the state (modules, optimizers, anything with ``state_dict`` /
  ``load_state_dict``, as ``ctx.restore`` takes it) and loads the newest committed checkpoint
  into it through hpcrun's Checkpointer; it returns the step to continue from.
- :func:`should_stop` is a step boundary (collective: every rank calls it at the same step): the
  ranks agree on a pending preemption and on a checkpoint the spec's cadence asks for. On a stop
  it commits the registered state at that boundary, fenced by the run's generation like a
  ``main(ctx)`` commit, and returns True on every rank.
- :func:`report` writes the same step event ``ctx.step_done(**metrics)`` writes (``loss``,
  ``tokens`` and any other number), plus the heartbeat the agent's hang watch reads.
- :func:`save` commits the final state (collective).

Outside hpcrun (plain ``torchrun``, ``python train.py``) every call is a no-op and the first
one warns once: :func:`restore` returns 0, :func:`should_stop` False.

The default process group is the script's: call ``init_process_group`` before :func:`restore`.
hpcrun adds its own gloo groups beside it (the checkpoint plane's). The preemption signal is
hpcrun's to catch while lite is in use: :func:`restore` installs a handler (it only sets a flag)
for the run's ``preempt_signal``, the site's signal and SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcrun.errors import EnvError

if TYPE_CHECKING:
    from hpcrun.runtime.rank.context import Context

__all__ = ["report", "restore", "save", "should_stop"]

_WARNING = ("hpcrun.lite: not running under hpcrun (no HPCRUN_RUN_DIR); restore, should_stop, "
            "report and save do nothing. Submit the script with `hpcrun submit` (script: in "
            "run.yaml) to get commits, stops and status")


class _Session:
    """This rank's link to hpcrun: the context built around the script's process group."""

    def __init__(self, ctx: Context, signals: contextlib.ExitStack) -> None:
        self.ctx = ctx
        self.signals = signals  # the flag's handlers, for the life of the process
        self.closed = False


_session: list[_Session] = []
_warned: list[bool] = []


def restore(state: Mapping[str, Any]) -> int:
    """Register ``state`` for checkpoints and load the newest committed one into it.

    Args:
        state: name → object with ``state_dict()`` / ``load_state_dict()`` (a module, an
            optimizer, a scheduler, a loader), the same on every restart.

    Returns:
        The number of steps completed in the restored checkpoint (0 on a first start).

    Raises:
        EnvError: the script's default process group is not formed yet.
    """
    session = _current()
    if session is None:
        return 0
    return session.ctx.restore(**dict(state))


def should_stop() -> bool:
    """Whether the ranks agreed to stop here (a preemption is pending); the stop commit is then
    done and the script should leave its loop. Collective: every rank calls it at the same step.
    Also saves when the spec's checkpoint cadence says one is due."""
    session = _current()
    if session is None or session.closed:
        return False
    if not session.ctx.boundary():
        return False
    _close(session, stopped=True)
    return True


def report(step: int, **metrics: float) -> None:
    """Report optimizer step ``step`` (completed steps, counting from 1) as done, with its
    metrics: ``loss``, ``tokens`` (this rank's), ``input_wait_s`` and any other number."""
    session = _current()
    if session is None or session.closed:
        return
    ctx = session.ctx
    if step != ctx.step + 1:
        print(f"hpcrun.lite: report({step}) after step {ctx.step}: hpcrun counts steps itself "
              f"and records this one as step {ctx.step + 1}", file=sys.stderr)
    loss = metrics.pop("loss", None)
    tokens = int(metrics.pop("tokens", 0))
    wait = metrics.pop("input_wait_s", None)
    ctx.step_done(tokens=tokens, loss=None if loss is None else float(loss),
                  input_wait_s=None if wait is None else float(wait), **metrics)


def save(state: Mapping[str, Any] | None = None) -> None:
    """Commit the final state at the last reported step (collective). ``state`` replaces the
    registered state when given (a script that never called :func:`restore`)."""
    session = _current()
    if session is None or session.closed:
        return
    if state is not None and not session.ctx.restored:
        session.ctx.register(**dict(state))
    session.ctx.finish()
    _close(session, stopped=False)


# -- the session -----------------------------------------------------------------------------

def _current() -> _Session | None:
    """This rank's session, opened by the first call (None outside hpcrun). A script that
    reports steps without :func:`restore` runs with no state registered: its first step
    warns that no checkpoint will be committed."""
    if _session:
        return _session[0]
    environ = dict(os.environ)
    if "HPCRUN_RUN_DIR" not in environ:
        if not _warned:
            _warned.append(True)
            print(_WARNING, file=sys.stderr)
        return None
    _session.append(_open(environ))
    return _session[0]


def _open(environ: Mapping[str, str]) -> _Session:
    import torch.distributed as dist

    from hpcrun.launch.signals import StopFlag, signal_number, stop_on
    from hpcrun.runtime.rank.script import RANK_SIGNAL_ENV
    from hpcrun.runtime.rank.worker import build_context

    if not (dist.is_available() and dist.is_initialized()):
        raise EnvError("hpcrun.lite: the default process group is not initialised; call "
                       "torch.distributed.init_process_group(backend) before lite.restore(...) "
                       "(hpcrun leaves the default group to the script)")
    stop = StopFlag()
    signals = contextlib.ExitStack()
    wanted = {signal.SIGTERM, signal_number(environ.get("HPCRUN_PREEMPT_SIGNAL", "USR1")),
              signal_number(environ.get(RANK_SIGNAL_ENV, "SIGTERM"))}
    signals.enter_context(stop_on(sorted(wanted), stop))
    return _Session(build_context(environ, stop), signals)


def _close(session: _Session, *, stopped: bool) -> None:
    """After the stop commit or the final one: finish what is in flight and tell the agent
    how this rank ended (its exit code is the script's own)."""
    from hpcrun.runtime.incarnation import Ending
    from hpcrun.runtime.rank.worker import write_exit_report

    ctx = session.ctx
    session.closed = True
    ctx.close()
    status = Ending.PREEMPTED if stopped else Ending.SUCCEEDED
    write_exit_report(ctx.inc.exit_report(ctx.rank),
                      {"rank": ctx.rank, "status": status, "step": ctx.step})
