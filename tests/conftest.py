"""Shared fixtures: paths to the project and to the reference data."""
from __future__ import annotations

from pathlib import Path

import pytest

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
