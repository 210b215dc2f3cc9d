"""Reading back what a report page embeds."""

from __future__ import annotations

import json
from typing import Any


def read_figures_json(page: str) -> dict[str, Any]:
    """The JSON data block of a report page."""
    head = '<script type="application/json" id="hpcrun-figures">'
    start = page.index(head) + len(head)
    return json.loads(page[start:page.index("</script>", start)])  # type: ignore[no-any-return]
