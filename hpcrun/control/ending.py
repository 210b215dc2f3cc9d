"""The hook a writer of a terminal state calls so that the run's post-run manifest follows.

The control plane records SUCCEEDED, FAILED and CANCELLED (cancel, a reconcile pass); what the
manifest holds (ETTR, artifacts, cost) is the observe plane's, which sits above it. So a
caller that can see both (the CLI, the in-job supervisor) passes an :data:`EndPublisher`, and
the control plane calls it under the fence it published the terminal state with, through
:func:`publish_ending`: a manifest that cannot be written never undoes the terminal state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hpcrun.control.log import RunLog
from hpcrun.errors import HpcrunError, StaleGenerationError

__all__ = ["EndPublisher", "publish_ending"]

_LOG = logging.getLogger(__name__)

EndPublisher = Callable[[RunLog, int, str], None]
"""``publish(log, generation, holder)``: write and publish the post-run manifest, fenced under
``generation``/``holder``, after a terminal state was published under that fence."""


def publish_ending(publisher: EndPublisher | None, log: RunLog, *, generation: int,
                   holder: str) -> bool:
    """Call ``publisher`` after a terminal state; True when it published.

    A newer fence (someone else owns the run now) or a storage error is logged and swallowed:
    the terminal state stands, and the manifest is the newer owner's, or missing (``hpcrun show
    --manifest`` says so).
    """
    if publisher is None:
        return False
    try:
        publisher(log, generation, holder)
    except StaleGenerationError as exc:
        _LOG.info("post-run manifest of %s not published: %s", log.run_dir.name, exc)
        return False
    except (HpcrunError, OSError, ValueError) as exc:
        _LOG.warning("post-run manifest of %s could not be published: %s; the run's terminal "
                     "state stands", log.run_dir.name, exc)
        return False
    return True
