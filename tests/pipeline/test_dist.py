"""``pipeline-dist``'s zip is complete: for the executors' tasks and for a driver that takes
trioha from it (``spark-submit --py-files`` puts it first on the driver's path too).

These run without Spark; tests/pipeline/test_cluster.py runs the zip on a cluster.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.pipeline._pythons import link_packages
from tests.pipeline.conftest import MISSING, SKIP_REASON

if MISSING:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from trioha.pipeline import _dist

PIPELINE = Path(_dist.__file__).parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> _dist.Dist:
    return _dist.build_dist(tmp_path_factory.mktemp("dist") / "tp.zip")


def _module_of(arc: str) -> str:
    """``trioha/pipeline/_cli.py`` -> ``trioha.pipeline._cli``."""
    return arc.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def test_the_zip_holds_every_module_of_the_pipeline(dist: _dist.Dist) -> None:
    shipped = {_module_of(a) for a in dist.modules}
    package = {
        "trioha.pipeline" if p.stem == "__init__" else f"trioha.pipeline.{p.stem}"
        for p in PIPELINE.glob("*.py")
    }
    assert package <= shipped, package - shipped
    assert {"trioha.pipeline.__main__", "trioha.pipeline._cli", "trioha._logging"} <= shipped
    assert not [m for m in shipped if m.startswith(("trioha.net", "trioha.broker", "trio."))]
    with zipfile.ZipFile(dist.zip_path) as zf:
        assert sorted(zf.namelist()) == sorted(dist.modules)


def _trioha_imports(source: str, module: str) -> set[str]:
    """Every trioha module *source* imports when it runs, at any depth (in functions too);
    not those under ``if TYPE_CHECKING:``, which only the type checker reads."""
    package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
    found = set()
    todo: list[ast.AST] = [ast.parse(source)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
        todo.extend(ast.iter_child_nodes(node))
    return {name for name in found if name.split(".")[0] == "trioha"}


def test_every_trioha_import_of_a_shipped_module_is_shipped(dist: _dist.Dist) -> None:
    """Imports inside functions too: the probe that picks the modules sees only those a
    module runs when imported."""
    shipped = {_module_of(a) for a in dist.modules}
    with zipfile.ZipFile(dist.zip_path) as zf:
        wanted = {
            name
            for arc in dist.modules
            if arc.startswith("trioha/")
            for name in _trioha_imports(zf.read(arc).decode(), _module_of(arc))
        }
    # `from trioha.x import name` names a module or an attribute: only modules must be there
    assert {n for n in wanted if _is_module(n)} - shipped == set()
    assert "trioha.pipeline._session" in wanted  # the check sees imports inside functions


def _is_module(name: str) -> bool:
    path = Path(PIPELINE.parents[1], *name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_a_driver_with_only_the_zip_imports_all_of_the_pipeline_from_it(
    dist: _dist.Dist, tmp_path: Path
) -> None:
    """What a driver under ``spark-submit`` has: no site-packages, the requirements file's
    packages and pyspark (``spark-submit`` adds it), and the zip first on the path."""
    wanted = {r.split("==")[0] for r in dist.requirements} | {"pyspark", "py4j"}
    deps = link_packages(tmp_path / "deps", wanted)

    def run(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-S", *args],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": f"{dist.zip_path}:{deps}", "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    code = (
        "import importlib, json, sys\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
    )
    names = sorted(_module_of(a) for a in dist.modules if a.startswith("trioha/pipeline/"))
    files = json.loads(run("-c", code, json.dumps(names)))
    assert all(f.startswith(f"{dist.zip_path}/") for f in files.values()), files
    assert "--engine {auto,jvm,python}" in run("-m", "trioha.pipeline", "stats", "--help")
