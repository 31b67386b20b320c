"""The docs show what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from trioha.failover import failover_table_mermaid
from trioha.proto import transition_table_mermaid

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_state_diagram_in_the_docs_is_generated_from_the_table() -> None:
    text = (DOCS / "replication.md").read_text()
    match = re.search(
        r"<!-- diagram:begin -->\n```mermaid\n(.*?)```\n<!-- diagram:end -->", text, re.S
    )
    assert match is not None
    assert match.group(1) == transition_table_mermaid()


def test_the_failover_diagram_is_generated_from_the_core_table() -> None:
    text = (DOCS / "failover.md").read_text()
    match = re.search(
        r"<!-- diagram:begin -->\n```mermaid\n(.*?)```\n<!-- diagram:end -->", text, re.S
    )
    assert match is not None
    assert match.group(1) == failover_table_mermaid()
