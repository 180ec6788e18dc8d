"""The built-in schedules a search result is measured against (and warm-started from).

Every registered generator whose schedule runs on the search's placement (same kind,
ranks and stages) is generated at the same costs and links (cost-aware planners plan with
them), lowered with the chosen comm policy and simulated under the chosen semantics; its
makespan, bubble ratio and per-rank peak activation (the memory model of ``schedsim
memory``) form one :class:`Baseline`. Memory-limited planners (``zb-1p``, ``zb-2p``,
``zbv``) also run once at the search's own limit when it is one value for every rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedsim.analysis.memory import MemoryModel, peak_activation
from schedsim.errors import SchedsimError
from schedsim.program.ir import Placement, Program
from schedsim.search.problem import SearchProblem
from schedsim.search.timing import asap, makespan_of
from schedsim.sim.costs import CommModel, CostModel, LinkModel


@dataclass
class Baseline:
    """One built-in schedule at the search's costs. ``makespan``/``bubble``: simulated
    under the chosen semantics and comm policy; ``peak``: per-rank peak activation;
    ``fits``: within the limit on every rank; ``order``: its op order in the search
    problem (None when it runs ops the problem does not have, e.g. FB pairs) and
    ``fused``: the ``B`` ops it runs fused as ``BW``; ``model_makespan``: that order's
    makespan in the solver's model (with every backward split)."""

    label: str
    name: str
    params: dict[str, Any]
    makespan: float | None
    bubble: float | None
    peak: list[float]
    fits: bool
    order: list[list[int]] | None = None
    fused: frozenset[int] = frozenset()
    model_makespan: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {"schedule": self.label, "makespan": self.makespan, "bubble_ratio": self.bubble,
                "peak_activation": self.peak, "fits": self.fits, "note": self.note}


@dataclass
class Baselines:
    rows: list[Baseline] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def best_hint(self) -> Baseline | None:
        """The fitting baseline with the least makespan in the solver's model."""
        ok = [b for b in self.rows if b.fits and b.order is not None
              and b.model_makespan is not None]
        return min(ok, key=lambda b: b.model_makespan) if ok else None


def candidates(pb: SearchProblem) -> list[tuple[str, dict[str, Any]]]:
    """``(generator name, parameters)`` worth trying on ``pb``'s placement."""
    from schedsim.generators import get, names

    pl = pb.placement
    chunks = pl.stages // pl.ranks
    uniform = len(set(pb.limit)) == 1
    out: list[tuple[str, dict[str, Any]]] = []
    for name in names():
        spec = get(name)
        if spec.placement.split()[0] != pl.kind:
            continue
        acc = spec.accepted()
        base: dict[str, Any] = {}
        if "chunks" in acc:
            if pl.kind != "loop" or chunks < 2:
                continue
            base["chunks"] = chunks
        out.append((name, base))
        if "overlap" in acc:
            out.append((name, {**base, "overlap": False}))
        if "mem_limit" in acc and uniform:
            out.append((name, {**base, "mem_limit": pb.limit[0]}))
    return out


def _label(name: str, params: dict[str, Any], pl: Placement) -> str:
    """``zb-1p (mem-limit 6)``: the name plus the parameters the search chose."""
    parts = []
    for k, v in params.items():
        if k == "chunks" and v == pl.stages // pl.ranks:
            continue
        parts.append(f"{k.replace('_', '-')} {v:g}" if isinstance(v, float)
                     else f"{k}={str(v).lower()}")
    return f"{name} ({', '.join(parts)})" if parts else name


def run_baselines(pb: SearchProblem, costs: CostModel, link: LinkModel, comm: CommModel,
                  policy: str, memory: MemoryModel, deadline: float | None = None
                  ) -> Baselines:
    """Generate, lower and simulate every applicable built-in (see module docstring).
    ``deadline`` (a ``time.perf_counter()`` value): the cost-aware planners (generators
    that take ``costs``: zb-1p, zb-2p, zbv; seconds each at 64 ranks x 1000
    microbatches) not started by then are listed in ``skipped`` instead, so the overrun
    past it is at most the one planner under way; the fixed-rule built-ins always run
    (they are the warm start and the table's reference)."""
    import time

    from schedsim.generators import generate, get
    from schedsim.program.lower import lower
    from schedsim.sim.simulate import simulate

    pl = pb.placement
    out = Baselines()
    seen: set[tuple] = set()
    for name, params in candidates(pb):
        label = _label(name, params, pl)
        kw = dict(params)
        acc = get(name).accepted()
        if "costs" in acc and deadline is not None and time.perf_counter() >= deadline:
            out.skipped[label] = ("not run: the built-ins' share of --time-limit was "
                                  "spent; a longer --time-limit compares it too")
            continue
        if "costs" in acc:
            kw["costs"] = costs
        if "link" in acc:
            kw["link"] = link
        try:
            got = generate(name, pl.ranks, pb.microbatches, **kw)
        except SchedsimError as e:
            out.skipped[label] = str(e)
            continue
        sched = got.schedule() if isinstance(got, Program) else got
        gp = sched.placement
        if (gp.kind, gp.ranks, gp.stages) != (pl.kind, pl.ranks, pl.stages):
            continue
        key = (name, tuple(tuple(map(str, row)) for row in sched.ranks))
        if key in seen:             # a planner at the limit it runs at by default
            continue
        seen.add(key)
        try:
            tl = simulate(lower(sched, policy), costs, link, comm, raise_on_deadlock=False)
        except SchedsimError as e:
            out.skipped[label] = str(e)
            continue
        peak = peak_activation(tl, memory)
        fits = all(p <= lim + 1e-9 for p, lim in zip(peak, pb.limit))
        if tl.deadlock is not None:
            out.rows.append(Baseline(label, name, params, None, None, peak, False,
                                     note=f"deadlocks under {comm.semantics}"))
            continue
        got = pb.order_and_fused(sched)
        order, fused, ms = None, frozenset(), None
        if got is not None:
            order, fused = got
            st = asap(pb, order)
            ms = makespan_of(pb, st) if st is not None else None
        out.rows.append(Baseline(label, name, params, tl.makespan, tl.bubble_ratio(), peak,
                                 fits, order, fused, ms))
    return out


def schedule_peak_1f1b(ranks: int, microbatches: int, memory: MemoryModel) -> list[float]:
    """Per-rank peak activation of 1F1B (one stage per rank) under ``memory``: the
    default memory limit (its maximum) and the ``1f1b`` per-rank profile."""
    return schedule_peak("1f1b", ranks, microbatches, memory)


def schedule_peak(name: str, ranks: int, microbatches: int, memory: MemoryModel,
                  **params: Any) -> list[float]:
    """Per-rank peak activation of built-in ``name`` under ``memory`` (from its
    data-semantics timeline). Raises :class:`SchedsimError` when it cannot be built."""
    from schedsim.generators import build_program
    from schedsim.sim.simulate import simulate

    prog = build_program(name, ranks, microbatches, **params)
    return peak_activation(simulate(prog), memory)
