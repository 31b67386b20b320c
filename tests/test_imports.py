"""What importing a part of trioha costs: the sans-IO cores and the pipeline load no Trio.

(That the sans-IO cores import no IO module at all is checked by a walk over their imports:
``tests/proto/test_state.py`` for ``trioha.proto``, ``tests/failover/test_core.py`` for
``trioha.failover``.)

Each import runs in a fresh interpreter, so what an earlier test imported cannot hide a cost.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import importlib, json, sys
importlib.import_module({module!r})
names = [m for m in sys.modules if m == "trio" or m.startswith(("trio.", "trioha"))]
print(json.dumps(sorted(names)))
"""


def _loaded(module: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


@pytest.mark.parametrize(
    "module", ["trioha", "trioha.proto", "trioha.failover", "trioha.store", "trioha.pipeline"]
)
def test_light_parts_load_no_trio(module: str) -> None:
    loaded = _loaded(module)
    assert "trio" not in loaded, f"import {module} loads trio"
    assert not any(m.startswith(("trioha.broker", "trioha.net")) for m in loaded), loaded


def test_root_resolves_public_names_on_first_use() -> None:
    import trioha

    assert trioha.open_broker.__module__.startswith("trioha.broker")
    assert trioha.BrokerConfig.__name__ == "BrokerConfig"
    assert set(trioha.__all__) <= set(dir(trioha))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = trioha.nope
