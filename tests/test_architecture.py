"""The rooms keep their layering, and docs/architecture.md shows the imports as they are."""

from __future__ import annotations

import re
from pathlib import Path

from tests.architecture import forbidden, mermaid, room_edges

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_no_room_imports_a_room_it_may_not() -> None:
    assert forbidden(room_edges()) == {}


def test_the_rooms_form_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in room_edges():
        graph.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert [room for room in graph if reaches(room, room, set())] == []


def test_the_import_diagram_in_the_docs_is_generated_from_the_code() -> None:
    text = (DOCS / "architecture.md").read_text()
    match = re.search(
        r"<!-- imports:begin -->\n```mermaid\n(.*?)```\n<!-- imports:end -->", text, re.S
    )
    assert match is not None
    assert match.group(1) == mermaid()


def test_a_forbidden_import_is_noticed_wherever_it_hides(tmp_path: Path) -> None:
    package = tmp_path / "trioha"
    for room in ("store", "broker", "proto"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "store" / "_log.py").write_text(
        "def lazy():\n    from trioha.broker import Broker\n"
    )
    (package / "proto" / "_state.py").write_text("from ..broker import x\n")
    assert forbidden(room_edges(package)) == {
        ("store", "broker"): ["trioha.store._log -> trioha.broker"],
        ("proto", "broker"): ["trioha.proto._state -> trioha.broker"],
    }
