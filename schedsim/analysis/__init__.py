"""Analysis of a :class:`~schedsim.timeline.Timeline` (and the program that produced it).

- :mod:`.stalls`: every idle interval of every rank, with a named cause
  (:func:`~schedsim.analysis.stalls.attribute_stalls`);
- :mod:`.align`: per message, when the data was ready, posted, transferred and consumed;
- :mod:`.graph` / :mod:`.critical`: the dependency graph of one run (networkx), the
  critical path and each op's slack;
- :mod:`.query`: counterfactual "does X delay Y" queries, answered by re-simulating with
  the cause made free;
- :mod:`.metrics`: bubble ratios (makespan-based and the zero-bubble paper's span-based);
- :mod:`.compare`: every applicable schedule side by side;
- :mod:`.diff`: per-op start deltas between two schedules with the same ops;
- :mod:`.accuracy`: the prediction error of a timeline against a reference (a
  measurement): makespan error and per-op start error, one definition everywhere;
- :mod:`.lint`: program lints (late sends, unrelated recvs in a batch, crossed posting
  orders).

Every function takes times in the timeline's ``unit``.
"""
from __future__ import annotations

from schedsim.analysis.stalls import CAUSES, Stall, attribute_stalls

__all__ = ["CAUSES", "Stall", "attribute_stalls"]
