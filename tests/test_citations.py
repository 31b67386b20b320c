"""Every reference to RocketMQ facts resolves inside the repository.

Code and docs cite ``docs/rocketmq-protocol.md §n``; each cited section must exist there, and
nothing may point at a file outside the project.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "rocketmq-protocol.md"
SOURCES = [
    *sorted((ROOT / "trioha").rglob("*.py")),
    *sorted((ROOT / "model").rglob("*.py")),
    *sorted((ROOT / "bench").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
]


def _sections() -> set[str]:
    return set(re.findall(r"^#+ §([0-9.]+)", PROTOCOL.read_text(), re.M))


def test_every_cited_section_exists() -> None:
    sections = _sections()
    missing = []
    for path in SOURCES:
        for match in re.finditer(
            r"rocketmq-protocol\.md((?:,? ?§[0-9.]+(?:–[0-9.]+)?)+)", path.read_text()
        ):
            for number in re.findall(r"§([0-9]+(?:\.[0-9]+)?)", match.group(1)):
                if number not in sections:
                    missing.append(f"{path.relative_to(ROOT)}: §{number}")
    assert missing == []


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(r"shared/spec|rocketmq-ha\.md|\bspec §|STYLE §")
    assert [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p != Path(__file__) and outside.search(p.read_text())
    ] == []
