"""The big model-checking runs (``@pytest.mark.slow``) run only when asked: ``pytest -m slow``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a long model-checking run; select it with -m slow")
    for item in items:
        if "slow" in item.keywords and "tests/model" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)
