"""The rooms keep their layering, and docs/architecture.md shows the imports as they are."""

from __future__ import annotations

import re
from pathlib import Path

from tests.architecture import (
    REACHES_ALLOWED,
    forbidden,
    import_cycles,
    mermaid,
    outside_reaches,
    reaches,
    room_edges,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_no_room_imports_a_room_it_may_not() -> None:
    assert forbidden(room_edges()) == {}


def test_rooms_import_each_other_only_through_their_faces() -> None:
    assert reaches() == []


def test_the_allowed_reaches_are_few_and_each_says_why() -> None:
    assert len(REACHES_ALLOWED) <= 3
    assert all(reason.strip() for reason in REACHES_ALLOWED.values())


def test_tests_bench_and_model_use_a_face_for_what_it_exports() -> None:
    assert outside_reaches() == []


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


def test_no_module_imports_itself_round_a_circle() -> None:
    assert import_cycles() == []


def test_a_circle_of_modules_is_noticed_wherever_it_closes(tmp_path: Path) -> None:
    package = tmp_path / "trioha"
    (package / "broker").mkdir(parents=True)
    (package / "broker" / "__init__.py").write_text("from trioha.broker._a import x\n")
    (package / "broker" / "_a.py").write_text("from trioha.broker._b import y\n")
    (package / "broker" / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trioha.broker import x\n"
    )
    (package / "broker" / "_c.py").write_text("def f():\n    from . import _d\n")
    (package / "broker" / "_d.py").write_text("from trioha.broker._c import f\n")
    (package / "broker" / "_e.py").write_text("from trioha.broker._a import x\n")
    assert import_cycles(package) == [
        ["trioha.broker", "trioha.broker._a", "trioha.broker._b"],
        ["trioha.broker._c", "trioha.broker._d"],
    ]


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


def test_a_reach_past_a_face_is_noticed_in_every_spelling(tmp_path: Path) -> None:
    package = tmp_path / "trioha"
    for room in ("store", "broker"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "store" / "_message.py").write_text("")
    (package / "store" / "strategies.py").write_text("")
    (package / "_errors.py").write_text("")
    (package / "broker" / "_a.py").write_text("from trioha.store._message import x\n")
    (package / "broker" / "_b.py").write_text("from trioha.store import _message\n")
    (package / "broker" / "_c.py").write_text("def f():\n    import trioha.store._message\n")
    (package / "broker" / "_d.py").write_text("from ..store._message import x\n")
    (package / "broker" / "_fine.py").write_text(
        "from trioha.store import x\n"
        "from trioha.store.strategies import y\n"
        "from trioha._errors import E\n"
        "from trioha.broker._a import z\n"
    )
    assert reaches(package) == [
        "trioha.broker._a -> trioha.store._message",
        "trioha.broker._b -> trioha.store._message",
        "trioha.broker._c -> trioha.store._message",
        "trioha.broker._d -> trioha.store._message",
    ]


def test_outside_code_may_look_inside_only_where_the_face_cannot_serve(tmp_path: Path) -> None:
    package = tmp_path / "trioha"
    (package / "store").mkdir(parents=True)
    (package / "store" / "__init__.py").write_text('__all__ = ["x"]\n')
    (package / "store" / "_message.py").write_text("")
    for directory in ("tests/store", "tests/broker", "bench"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "tests" / "store" / "test_m.py").write_text("from trioha.store._message import x\n")
    (tmp_path / "tests" / "broker" / "test_b.py").write_text(
        "from trioha.store._message import hidden\nfrom trioha.store._message import x, hidden\n"
    )
    (tmp_path / "bench" / "b.py").write_text("def f():\n    from trioha.store._message import x\n")
    assert outside_reaches(("tests", "bench"), package) == [
        "tests/broker/test_b.py:2: x from trioha.store",
        "bench/b.py:2: x from trioha.store",
    ]
