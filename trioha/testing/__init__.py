"""Public helpers for testing code built on trioha.

Submodules (imported on first use, so that importing this package needs nothing extra):

- ``trioha.testing.strategies``: Hypothesis strategies for stored messages (needs hypothesis).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["strategies"]


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
