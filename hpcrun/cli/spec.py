"""``hpcrun spec explain [KEY]``: the run.yaml (or site config) reference in a terminal."""

from __future__ import annotations

import click

from hpcrun.errors import ConfigError, SpecError


@click.group()
def spec() -> None:
    """The run.yaml reference: every key, its type, default, allowed values and meaning."""


@spec.command("explain")
@click.argument("key", required=False)
@click.option("--site", "site", is_flag=True,
              help="The site config's keys instead of run.yaml's.")
@click.option("--markdown", is_flag=True,
              help="The whole reference as Markdown: what docs/spec.md (docs/site.md) holds.")
def explain(key: str | None, site: bool, markdown: bool) -> None:
    """Explain KEY (`resources.nodes`, or a section: `checkpoint`); every key without one.

    \b
      hpcrun spec explain                    every run.yaml key
      hpcrun spec explain checkpoint         one section
      hpcrun spec explain --site partition   a site config key
      hpcrun spec explain --markdown         docs/spec.md (make spec-docs writes it)
    """
    from hpcrun.control.specref import Reference, spec_reference

    reference: Reference
    if site:
        from hpcrun.launch.siteref import site_reference  # only --site loads the launch plane

        reference = site_reference()
    else:
        reference = spec_reference()
    if markdown:
        if key is not None:
            raise click.UsageError("--markdown prints the whole reference; leave KEY out")
        click.echo(reference.markdown(), nl=False)
        return
    rows = reference.select(key, error=ConfigError if site else SpecError)
    click.echo(reference.text(rows), nl=False)
