"""Typo suggestions for names the user types (schedules, policies, semantics, ...)."""
from __future__ import annotations

import difflib
from typing import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` (difflib, ratio >= 0.6;
    case-insensitive), or ``""`` when none is close."""
    choices = list(choices)
    low = {c.lower(): c for c in choices}
    best = difflib.get_close_matches(word.lower(), list(low), n=1, cutoff=0.6)
    return f" (did you mean '{low[best[0]]}'?)" if best else ""
