"""``pipeline-dist``: the artifact Spark executors need to run the pipeline.

Executors unpickle the data sources, readers and the audit's task function by reference to
``trioha.pipeline``, so they must import it, and what it imports: a few pure-Python modules
of trioha (the lazy package root, the error tree, the store's record codec), ``attrs`` and
``tqdm``.
Those go into one zip for ``--py-files`` / :func:`spark_session`'s *py_files*. Nothing of
the broker, the network code or Trio is imported, so none of it is shipped.

The zip is complete for the driver too, not only for the tasks. ``spark-submit
--py-files`` puts it first on the driver's import path (Spark's ``PythonRunner``), ahead of
any installed trioha, for the entry file :data:`trioha.pipeline.SUBMIT_FILE` and for a job
script alike; once ``trioha`` is found in the zip, every ``trioha.*`` module is looked up
there and nowhere else. So the zip holds every module of ``trioha.pipeline`` (the command
line, the session, the JVM engine's driver side, the progress reporter) and everything they
import, and the driver runs the same code as its executors, whether or not trioha is
installed where it runs.

The JVM engine's jar (:mod:`trioha.pipeline._jvm`) is copied beside the zip when a JDK
could build it, for ``spark-submit --jars``; :func:`spark_session` adds it by itself.

The binary dependencies (numpy, pyarrow, and lz4/zstandard for compressed bodies) cannot
travel in a zip; they are written out as a requirements file pinned to the versions the
driver runs, to install into the executors' Python.

Which modules to ship is not a list kept by hand: a fresh interpreter imports every module
of ``trioha.pipeline`` and the zip holds exactly the trioha modules that were loaded, and the
pure-Python packages they use (:data:`PURE_PACKAGES`) whole. (The pipeline's imports inside
functions name only its own modules, which are all imported; ``tests/pipeline/test_dist.py``
checks that every ``trioha`` import anywhere in a shipped module is shipped.)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import attrs

from trioha._build import PURE_ENV
from trioha._errors import PipelineError

#: The package whose every module is shipped (see the module docstring for why every one).
PACKAGE = "trioha.pipeline"
#: Pure-Python packages shipped in the zip, whole: attrs, and tqdm (``trioha._progress``
#: draws its bars with it, and the pipeline reports progress through it).
PURE_PACKAGES = ("attr", "attrs", "tqdm")
#: Installed on the executors instead (compiled code).
BINARY_REQUIREMENTS = ("numpy", "pyarrow", "lz4", "zstandard")

_PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
tops = json.loads(sys.argv[2])
print(json.dumps({n: m.__file__ for n, m in sys.modules.items()
                  if n.split(".")[0] in tops and getattr(m, "__file__", None)}))
"""


@attrs.frozen
class Dist:
    """What :func:`build_dist` wrote."""

    zip_path: Path
    requirements_path: Path
    modules: tuple[str, ...]
    requirements: tuple[str, ...]
    #: The JVM engine's jar, copied beside the zip (None: no JDK to build it, see *jar_note*).
    jar_path: Path | None = None
    jar_note: str = ""

    def render(self) -> str:
        trioha = sum(1 for m in self.modules if m.startswith("trioha/"))
        return "\n".join(
            [
                f"wrote {self.zip_path} ({trioha} trioha modules, attrs and tqdm, "
                f"{self.zip_path.stat().st_size} bytes)",
                f"wrote {self.requirements_path}: {', '.join(self.requirements)}",
                "executors: install the requirements into their Python, then pass the zip",
                f"  spark-submit --py-files {self.zip_path} ... or "
                f"spark_session(master, py_files=[{str(self.zip_path)!r}], python=...)",
                (
                    f"wrote {self.jar_path}: the JVM engine; spark_session adds it to "
                    f"spark.jars itself, under spark-submit pass --jars {self.jar_path}"
                    if self.jar_path is not None
                    else f"no JVM engine jar ({self.jar_note}): reads take the Python engine"
                ),
            ]
        )


def shipped_modules() -> tuple[str, ...]:
    """Every module of :data:`PACKAGE`, from a listing of its directory (so a module added
    later is shipped without anyone remembering to), spark-submit's entry file included."""
    names = (p.stem for p in Path(__file__).parent.glob("*.py"))
    return tuple(sorted(PACKAGE if n == "__init__" else f"{PACKAGE}.{n}" for n in names))


def _loaded_files() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    paths = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    # The sources, never a compiled build's extensions: the executors run the pure package.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), PURE_ENV: "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _PROBE,
            json.dumps(shipped_modules()),
            json.dumps(["trioha", *PURE_PACKAGES]),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise PipelineError(f"cannot import the pipeline to see what it needs: {last}")
    files: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return files


def build_dist(out: str | os.PathLike[str]) -> Dist:
    """Write the executors' zip to *out* and the pinned requirements beside it."""
    zip_path = Path(out)
    if zip_path.suffix != ".zip":
        raise PipelineError(f"{zip_path}: the artifact must be a .zip (Spark's --py-files)")
    if not zip_path.parent.is_dir():
        raise PipelineError(f"no such directory: {zip_path.parent}")
    files = _loaded_files()
    entries: dict[str, Path] = {}
    for name, file in files.items():
        path = Path(file)
        top = name.split(".")[0]
        if top in PURE_PACKAGES:  # ship the whole package directory
            pkg = Path(files.get(top, file)).parent
            for extra in pkg.rglob("*"):
                if extra.suffix in (".py", ".pyi") or extra.name == "py.typed":
                    entries[extra.relative_to(pkg.parent).as_posix()] = extra
            continue
        parts = name.split(".")
        arc = "/".join(parts) + ("/__init__.py" if path.name == "__init__.py" else ".py")
        entries[arc] = path
    tmp = zip_path.with_name(zip_path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arc in sorted(entries):
            zf.write(entries[arc], arc)
    tmp.replace(zip_path)
    requirements = tuple(
        f"{name}=={importlib.metadata.version(name)}" for name in BINARY_REQUIREMENTS
    )
    req_path = zip_path.with_name(zip_path.stem + "-requirements.txt")
    req_path.write_text("".join(f"{r}\n" for r in requirements))
    from trioha.pipeline._jvm import ensure_jar

    built = ensure_jar()
    jar_path = None
    if built.path is not None:
        jar_path = zip_path.with_name(zip_path.stem + "-engine.jar")
        shutil.copyfile(built.path, jar_path)
    return Dist(zip_path, req_path, tuple(sorted(entries)), requirements, jar_path, built.reason)
