"""Schedule search: the best per-rank order of F, B, W (or F, BW) for given costs, links,
comm semantics and a memory limit, proven optimal in the solver's model where it can be.

- :mod:`.problem`: the ops, costs, inputs and memory as arrays (and their integer view);
- :mod:`.timing`: as-soon-as-possible timing of an order in that model;
- :mod:`.cpsat`: the exact core (CP-SAT, OR-Tools; optional ``schedsim[search]`` extra);
- :mod:`.baselines`: the built-in schedules at the same costs (table and warm start);
- :mod:`.refine`: local search judged by the engine under the chosen semantics;
- :mod:`.driver`: :func:`search`, which runs them in one time budget.
"""
from __future__ import annotations

from schedsim.search.driver import SearchResult, SearchSettings, search

__all__ = ["SearchResult", "SearchSettings", "search"]
