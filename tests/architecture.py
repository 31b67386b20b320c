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
}

#: What the broker may import: everything below it.
_BELOW_BROKER = frozenset(
    {"base", "config", "proto", "failover", "etcd", "store", "net", "remoting", "namesrv", "acl"}
)

#: What each room may import besides itself: the layering, written once. A room left out of a
#: list must never appear among that room's imports.
ALLOWED: dict[str, frozenset[str]] = {
    "root": frozenset({"base", "config", "store", "broker"}),  # the public face, resolved lazily
    "base": frozenset(),
    "proto": frozenset({"base"}),
    "failover": frozenset({"base", "proto"}),  # the control plane's sans-IO core, like proto
    "etcd": frozenset({"base", "config", "failover"}),  # the control plane's etcd client, on Trio
    "store": frozenset({"base", "proto"}),  # the epoch file holds proto's EpochHistory
    # BrokerConfig names the protocol's timing defaults and the store's FlushDiskType, both
    # written once where they belong.
    "config": frozenset({"base", "proto", "store"}),
    "net": frozenset({"base", "config", "proto", "store"}),
    "remoting": frozenset({"base", "config", "store"}),
    "acl": frozenset({"base", "config", "remoting"}),
    "namesrv": frozenset({"base", "config", "remoting", "acl"}),
    "broker": _BELOW_BROKER,
    "pipeline": frozenset({"base", "config", "store"}),
    "metrics": frozenset({"base", "config"}),  # reads statistics() snapshots, imports no broker
    "testing": frozenset({"base", "config", "proto", "failover", "store", "net"}),
    "cli": _BELOW_BROKER | {"broker", "pipeline", "metrics"},  # the top: what a user runs
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
    "etcd",
    "config",
    "store",
    "failover",
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


def is_face(module: str) -> bool:
    """Whether ``module`` is part of its room's face, the contract other rooms import from.

    A package room's face is its ``__init__`` (``trioha.store``) and any public module under it
    (``trioha.testing.strategies``); a top-level module (``trioha._errors``, ``trioha._config``)
    is a one-module room and so its own face. Anything with a ``_private`` part below the room
    is the room's own business.
    """
    return not any(part.startswith("_") for part in module.split(".")[2:])


def _modules(package: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path


def _is_module(dotted: str, package: Path) -> bool:
    parts = dotted.split(".")
    if parts[0] != package.name:
        return False
    path = package.joinpath(*parts[1:])
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imports(module: str, path: Path, package: Path = PACKAGE) -> Iterator[str]:
    """Every module ``module`` imports: ``from a.b import c`` counts as ``a.b.c`` when ``c`` is a
    module of its own, else as ``a.b``."""
    tree = ast.parse(path.read_text(), str(path))
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                source = node.module
            else:  # pragma: no cover - ``from . import`` always has a level
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield sub if _is_module(sub, package) else source


def room_edges(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) → the modules that import across that edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in _modules(package):
        src = room_of(module, package)
        assert src is not None
        for target in dict.fromkeys(_imports(module, path, package)):
            dst = room_of(target, package)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{module} -> {target}")
    return edges


#: Imports that reach into another room's private module although a face exists, each with the
#: reason it is right: ``(importing module, imported module)``. Empty: every room's face is
#: enough for its neighbours.
REACHES_ALLOWED: dict[tuple[str, str], str] = {}


def reaches(package: Path = PACKAGE) -> list[str]:
    """Imports inside trioha from another room's private module (not in :data:`REACHES_ALLOWED`)."""
    found = []
    for module, path in _modules(package):
        src = room_of(module, package)
        for target in dict.fromkeys(_imports(module, path, package)):
            dst = room_of(target, package)
            if dst is None or dst == src or is_face(target):
                continue
            if (module, target) not in REACHES_ALLOWED:
                found.append(f"{module} -> {target}")
    return found


def face_names(room_module: str, package: Path = PACKAGE) -> frozenset[str]:
    """The names a package room's face exports (its ``__all__``, read without importing it)."""
    init = package.parent.joinpath(*room_module.split("."), "__init__.py")
    if not init.is_file():
        return frozenset()
    for node in ast.parse(init.read_text(), str(init)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def mirrored_room(path: Path, root: Path, package: Path = PACKAGE) -> str | None:
    """The room a test file mirrors: ``tests/store/...`` the store, ``tests/test_config.py``
    the config (``trioha/_config.py``), ``tests/test_status.py`` the base; None for the rest."""
    rel = path.relative_to(root)
    if len(rel.parts) > 1:
        return rel.parts[0] if (package / rel.parts[0]).is_dir() else None
    name = rel.stem.removeprefix("test_")
    for candidate in (f"trioha.{name}", f"trioha._{name}"):
        if _is_module(candidate, package):
            return room_of(candidate, package)
    return None


def outside_reaches(
    directories: tuple[str, ...] = ("tests", "bench", "model"), package: Path = PACKAGE
) -> list[str]:
    """Code beside the package reaching past a face without need.

    Tests, benchmarks and the model may import a room's private modules, because looking
    inside is their point, but only (a) the tests that mirror that room (``tests/<room>/``,
    ``tests/test_<module>.py``), or (b) for a name the room's face does not export. A name the
    face exports is imported from the face.
    """
    top = package.parent
    found = []
    for directory in directories:
        root = top / directory
        for path in sorted(root.rglob("*.py")):
            mirrors = mirrored_room(path, root, package) if directory == "tests" else None
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                    continue
                room = room_of(node.module, package)
                if room is None or room == mirrors or is_face(node.module):
                    continue
                face = ".".join(node.module.split(".")[:2])
                exported = face_names(face, package) & {a.name for a in node.names}
                if exported:
                    where = path.relative_to(top)
                    found.append(
                        f"{where}:{node.lineno}: {', '.join(sorted(exported))} from {face}"
                    )
    return found


def module_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each trioha module (a package's ``__init__`` under the package's name) → the trioha
    modules it imports, at any depth of its code."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules(package):
        targets = graph.setdefault(module, set())
        for imported in _imports(module, path, package):
            target = imported
            while target and not _is_module(target, package):  # ``from a.b import name``
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
    return graph


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """The groups of modules that import each other round a circle (Tarjan's strongly connected
    components of more than one module), each sorted."""
    graph = module_imports(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def forbidden(edges: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """The edges :data:`ALLOWED` does not allow, with the imports that make them."""
    return {
        edge: modules
        for edge, modules in edges.items()
        if edge[1] not in ALLOWED.get(edge[0], frozenset())
    }


def mermaid() -> str:
    """The rooms and every import between them as a Mermaid flowchart.

    Edges into ``base`` (the exception tree and the plain values nearly every room uses) are
    drawn dotted, so the layering above them stays readable; none is left out.
    """
    edges = sorted(room_edges(), key=lambda e: (ORDER.index(e[0]), ORDER.index(e[1])))
    rooms = sorted({r for e in edges for r in e}, key=ORDER.index)
    lines = ["flowchart TD"]
    lines += [f"    {r}[{r}/]" if (PACKAGE / r).is_dir() else f"    {r}" for r in rooms]
    lines += [f"    {a} {'-.->' if b == 'base' else '-->'} {b}" for a, b in edges]
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
