"""Pythons that have only some of this environment's packages: what an executor (or a driver
under ``spark-submit``) has when trioha is not installed there."""

from __future__ import annotations

from pathlib import Path


def link_packages(target: Path, names: set[str]) -> Path:
    """A directory *target* of links to the installed packages (and their bundled libraries,
    ``numpy.libs``) whose names are in *names*; no ``.dist-info``."""
    import numpy

    site = Path(numpy.__file__).resolve().parents[1]
    target.mkdir(parents=True)
    for entry in site.iterdir():
        base = entry.name.split("-")[0].split(".")[0].lower()
        if base in names and not entry.name.endswith(".dist-info"):
            (target / entry.name).symlink_to(entry)
    return target
