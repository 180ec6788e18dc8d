"""Typo suggestions for names the user types (schedules, policies, semantics, GPUs,
keys, ...): the one home of the rule."""
from __future__ import annotations

import difflib
from typing import Iterable

#: the shortest typed word a prefix match is offered for (``"h"`` names nothing)
MIN_PREFIX = 2


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` most likely meant (case-insensitive), or None: a choice that
    ``word`` begins (at least :data:`MIN_PREFIX` characters; the shortest such, the first
    listed on a tie: ``h100`` -> ``h100-sxm``, ``dualpip`` -> ``dualpipe``), else the
    closest by difflib's ratio (>= 0.6), else the longest choice of at least
    :data:`MIN_PREFIX` characters that ``word`` begins (a short name spelt out:
    ``sequence`` -> ``seq``)."""
    choices = list(choices)
    low: dict[str, str] = {}
    for c in choices:
        low.setdefault(c.lower(), c)
    w = word.lower()
    if len(w) >= MIN_PREFIX:
        starts = [c for c in low if c.startswith(w) and c != w]
        if starts:
            return low[min(starts, key=len)]
    best = difflib.get_close_matches(w, list(low), n=1, cutoff=0.6)
    if best:
        return low[best[0]]
    begun = [c for c in low if len(c) >= MIN_PREFIX and w.startswith(c) and c != w]
    return low[max(begun, key=len)] if begun else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for :func:`closest` of ``choices``, or ``""`` when
    none is close."""
    best = closest(word, choices)
    return f" (did you mean '{best}'?)" if best is not None else ""
