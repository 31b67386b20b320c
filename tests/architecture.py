"""The rooms of trioha and what each may import, read from the code itself.

``python -m tests.architecture`` prints the import diagram that ``docs/architecture.md`` shows
(``--write`` puts it there);
``tests/test_architecture.py`` checks that the page matches it and that no room imports a room
it may not. Every import counts: at module level, inside functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trioha"

#: The top-level modules that are no package of their own, by the room they belong to.
_MODULE_ROOMS = {
    "_errors": "base",
    "_status": "base",
    "_histogram": "base",
    "_logging": "base",
    "_progress": "base",
    "_build": "base",
    "_config": "config",
    "_tuning": "config",
    "__init__": "root",
    "__main__": "cli",
    "_cli": "cli",
    "_clitools": "cli",
    "_demo": "cli",
    "_reseed": "cli",
}

#: What each room may import besides itself: the layering, written once. A room left out of a
#: list must never appear among that room's imports; ``base`` may be imported by every room.
ALLOWED: dict[str, frozenset[str]] = {
    "root": frozenset({"base", "config", "broker"}),  # the public face, resolved lazily
    "base": frozenset(),
    "proto": frozenset({"base"}),
    "config": frozenset({"base", "proto"}),  # the protocol's timing defaults, written once
    "store": frozenset({"base", "config", "proto"}),  # the epoch file holds proto's EpochHistory
    "net": frozenset({"base", "config", "proto", "store"}),
    "remoting": frozenset({"base", "config", "store"}),
    "acl": frozenset({"base", "config", "remoting"}),
    "namesrv": frozenset({"base", "config", "remoting", "acl"}),
    "broker": frozenset({"base", "config", "proto", "store", "net", "remoting", "namesrv", "acl"}),
    "pipeline": frozenset({"base", "config", "store"}),
    "metrics": frozenset({"base", "config"}),  # reads statistics() snapshots, imports no broker
    "testing": frozenset({"base", "config", "proto", "store", "net"}),
    "cli": frozenset(
        {
            "base",
            "config",
            "proto",
            "store",
            "net",
            "remoting",
            "namesrv",
            "acl",
            "broker",
            "pipeline",
            "metrics",
        }
    ),
}

#: Rooms in the order the diagram lists them (top: what a user runs; bottom: the values).
ORDER = [
    "root",
    "cli",
    "metrics",
    "broker",
    "testing",
    "pipeline",
    "namesrv",
    "acl",
    "net",
    "remoting",
    "store",
    "config",
    "proto",
    "base",
]


def room_of(module: str, package: Path = PACKAGE) -> str | None:
    """The room of a dotted ``trioha...`` module name; None for anything outside trioha."""
    parts = module.split(".")
    if parts[0] != "trioha":
        return None
    if len(parts) == 1:
        return "root"
    head = parts[1]
    if (package / head).is_dir():
        return head
    return _MODULE_ROOMS.get(head, head)


def _modules(package: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        yield ".".join(rel.parts), path


def _imports(module: str, path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base)
            elif node.module:
                yield node.module


def room_edges(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) → the modules that import across that edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in _modules(package):
        src = room_of(module, package)
        assert src is not None
        for target in _imports(module, path):
            dst = room_of(target, package)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{module} -> {target}")
    return edges


def forbidden(edges: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """The edges :data:`ALLOWED` does not allow, with the imports that make them."""
    return {
        edge: modules
        for edge, modules in edges.items()
        if edge[1] != "base" and edge[1] not in ALLOWED.get(edge[0], frozenset())
    }


def mermaid() -> str:
    """The rooms and their imports as a Mermaid flowchart.

    Edges to ``base`` and ``config``, which nearly every room has, are left out.
    """
    edges = sorted(
        {(a, b) for a, b in room_edges() if b not in {"base", "config"}},
        key=lambda e: (ORDER.index(e[0]), ORDER.index(e[1])),
    )
    rooms = sorted({r for e in edges for r in e}, key=ORDER.index)
    lines = ["flowchart TD"]
    lines += [f"    {r}[{r}/]" if (PACKAGE / r).is_dir() else f"    {r}" for r in rooms]
    lines += [f"    {a} --> {b}" for a, b in edges]
    return "\n".join(lines) + "\n"


def write_docs() -> None:
    """Put the current diagram into ``docs/architecture.md`` (``--write``)."""
    import re

    page = PACKAGE.parent / "docs" / "architecture.md"
    text = re.sub(
        r"(<!-- imports:begin -->\n```mermaid\n).*?(```\n<!-- imports:end -->)",
        lambda m: m.group(1) + mermaid() + m.group(2),
        page.read_text(),
        flags=re.S,
    )
    page.write_text(text)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        write_docs()
    else:
        print(mermaid(), end="")
