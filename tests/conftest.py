"""Shared fixtures: paths to the project and to the reference data."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline anywhere: the tests run on shared 2-core machines whose load
# swings (one example taking past Hypothesis' default 200 ms there is load, not a defect,
# and failed `test_program.py::test_token_round_trip` as "flaky"). Settings a test gives
# itself still apply on top of this profile.
settings.register_profile("schedsim", deadline=None)
settings.load_profile("schedsim")

ROOT = Path(__file__).resolve().parents[1]
#: the recorded references, copied from the project's shared/refs (sources in its README)
REFS = ROOT / "tests" / "data" / "refs"
SCHEDULES = ROOT / "schedules"

#: DualPipe README figure costs (B is the zero-bubble input-gradient backward)
FIGURE_COSTS = dict(F=1, B=1, W=1, BW=2, FB=3)


def ref_path(*parts: str) -> Path:
    """Path to a reference file; skips the test if the refs folder is absent."""
    p = REFS.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"reference data not found: {p}")
    return p


def shuffled_ranks(ranks, rnd) -> list[list]:
    """Each rank's instruction row with ``len(row) // 3`` random swaps (``rnd``: a
    ``random.Random``): orders that no generator writes, for tests that compare two forms
    of one computation on arbitrary programs."""
    rows = [list(r) for r in ranks]
    for r in rows:
        for _ in range(len(r) // 3):
            i, j = rnd.randrange(len(r)), rnd.randrange(len(r))
            r[i], r[j] = r[j], r[i]
    return rows
