"""The docs show what the code does."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from trioha.failover import failover_table_mermaid
from trioha.proto import transition_table_mermaid

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    ("page", "drawn"),
    [("replication.md", transition_table_mermaid), ("failover.md", failover_table_mermaid)],
)
def test_the_state_diagram_in_the_docs_is_generated_from_the_table(
    page: str, drawn: Callable[[], str]
) -> None:
    text = (DOCS / page).read_text()
    match = re.search(
        r"<!-- diagram:begin -->\n```mermaid\n(.*?)```\n<!-- diagram:end -->", text, re.S
    )
    assert match is not None
    assert match.group(1) == drawn()
