"""``hpcrun ckpt export``'s own parsing: --max-file-size in the units a user writes."""

from __future__ import annotations

import click
import pytest

from hpcrun.cli.ckpt_export import parse_size


@pytest.mark.parametrize(("text", "size"), [("5GB", 5 << 30), ("512MiB", 512 << 20),
                                            ("40KiB", 40 << 10), ("1000", 1000), ("2g", 2 << 30)])
def test_sizes_parse_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "-5GB", "5TB", "five", "1.5GB"])
def test_an_unreadable_size_is_refused_with_examples(text: str) -> None:
    with pytest.raises(click.BadParameter, match="expected a size such as 5GB"):
        parse_size(text)
