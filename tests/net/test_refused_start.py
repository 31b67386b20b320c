"""A master refused for a damaged log, started again: the second refusal still says where the
cut bytes are.

The first start's recovery moved the damaged tail out of the log (kept in ``lost+found``) and
was then refused; the second start finds a log with a clean end, nothing left to cut. Its
refusal must still name where the bytes past the end went (it said "kept 0 cut bytes in
nowhere" before the recovery report looked at what earlier starts had kept aside).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.net.test_divergence import SEG, damaged_store
from trioha import DamagedLogError
from trioha.net._divergence import open_master_history
from trioha.store import open_store


def test_a_second_refused_start_names_where_the_first_kept_the_cut_bytes(tmp_path: Path) -> None:
    offsets, _ = damaged_store(tmp_path)
    with open_store(tmp_path, segment_size=SEG) as store:
        first = store.recovery
        with pytest.raises(DamagedLogError):
            open_master_history(store)
    assert first.kept_aside and first.earlier_aside == ()
    (tmp_path / "abort").touch()  # it was refused: as after a crash, or a clean stop alike
    with open_store(tmp_path, segment_size=SEG) as store:
        second = store.recovery
        with pytest.raises(DamagedLogError) as raised:
            open_master_history(store)
    assert (second.cut_bytes, second.kept_aside) == (0, ())
    assert second.earlier_aside == tuple(sorted(first.kept_aside))
    kept = ", ".join(str(p) for p in second.earlier_aside)
    assert (
        f"kept 0 cut bytes in nowhere (nothing was readable); bytes from {offsets[1]} on that "
        f"an earlier start or cut took out of the log are in {kept}. New data"
    ) in str(raised.value)
