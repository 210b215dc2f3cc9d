"""The site config reference (``docs/site.md``), generated from :class:`SiteConfig` (pure).

The rows come from :func:`hpcrun.control.specref.reference_rows`, the same walk that documents
``run.yaml``; a site config has no digest, so the rows carry none.
"""

from __future__ import annotations

from hpcrun.control.specref import Reference, reference_rows
from hpcrun.launch.site import SiteConfig

SITE_INTRO = """\
Every key a site config (`site_configs/<name>.yaml`, or a file in `$HPCRUN_SITE_CONFIGS`)
accepts, generated from `SiteConfig` and its sections (`hpcrun/launch/site.py`) by
`make spec-docs`; edit the field docstrings there, not this page.
`hpcrun spec explain --site [KEY]` prints the same in a terminal.

A run spec names its site with `site:`; the spec's own keys (`resources.partition`,
`dist.backend`, `resources.sbatch_extra`, ...) override the site's defaults. Paths may hold
`$SLURM_JOB_ID`, `${SLURM_JOB_ID}`, `$USER` and `~`, expanded on the compute node.
"""


def site_reference() -> Reference:
    """The site config reference (:class:`~hpcrun.launch.site.SiteConfig`)."""
    return Reference(title="Site config reference", intro=SITE_INTRO, what="a site config",
                     command="hpcrun spec explain --site",
                     rows=reference_rows(SiteConfig, digest=False))
