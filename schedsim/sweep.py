"""Compare schedules: makespan, idle, bubble, activation and parameter memory, side by side.

Runs every registered generator (or a chosen list) at one (ranks, microbatches) and one
cost model, skipping with a note those whose constraints reject the size; each row is
computed by simulation, not derived by hand. This is the table DualPipe's README
("Pipeline Bubbles and Memory Usage Comparison") and the zero-bubble paper print; for the
schedules that table lists, :data:`TABLE_FORMULAS` gives its closed form to print beside
the simulated value.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from schedsim.analysis.memory import MemoryModel, param_memory, peak_activation
from schedsim.analysis.metrics import bubble_metrics
from schedsim.errors import SchedsimError
from schedsim.scenario import parse_scenario
from schedsim.sim.costs import CommModel, CostModel, LinkModel


@dataclass
class Formula:
    """A closed form from deepseek-ai/DualPipe's README table, in its own notation:
    PP = pipeline stages, F = forward, B = *full* backward (our BW), W = weight backward,
    F&B = an overlapped forward+backward pair (our FB)."""

    idle: str
    idle_fn: Callable[[int, CostModel], float]
    activation: str
    activation_fn: Callable[[int], float]
    params: str
    pp: Callable[[int], int] = lambda ranks: ranks   # PP from the number of ranks


def _c(costs: CostModel, kind: str) -> float:
    if kind == "FB":     # as the simulation prices it (typed, derived or F + BW)
        from schedsim.program.ir import Op

        return costs.cost(Op.fb(Op("F", 0, 0), Op("BW", 0, 1)))
    return costs.kind_cost(kind, 0, 0)


#: DualPipe README table ("based on the same number of PP stages"); DualPipeV has
#: PP = 2 x ranks stages (#devices = PP/2). Activation is in chunk activations, params in
#: stage copies.
TABLE_FORMULAS: dict[str, Formula] = {
    "1f1b": Formula("(PP-1)(F+B)", lambda p, c: (p - 1) * (_c(c, "F") + _c(c, "BW")),
                    "PP", lambda p: p, "1x"),
    "zb-1p": Formula("(PP-1)(F+B-2W)",
                     lambda p, c: (p - 1) * (_c(c, "F") + _c(c, "BW") - 2 * _c(c, "W")),
                     "PP", lambda p: p, "1x"),
    "dualpipe": Formula("(PP/2-1)(F&B+B-3W)",
                        lambda p, c: (p / 2 - 1) * (_c(c, "FB") + _c(c, "BW")
                                                    - 3 * _c(c, "W")),
                        "PP+1", lambda p: p + 1, "2x"),
    "dualpipev": Formula("(PP/2-1)(F&B+B-3W)",
                         lambda p, c: (p / 2 - 1) * (_c(c, "FB") + _c(c, "BW")
                                                     - 3 * _c(c, "W")),
                         "PP+1", lambda p: p + 1, "2x", pp=lambda ranks: 2 * ranks),
}


@dataclass
class CompareRow:
    """One schedule's numbers (times in the costs' unit; memory per rank: activation in
    one microbatch's activations of 1/ranks of the model, parameters in 1/ranks of the
    model — a DualPipe rank holds 2)."""

    schedule: str
    makespan: float
    idle: list[float]
    bubble_ratio: float
    span_bubble_rate: float
    peak_activation: list[float]
    param_memory: list[float]
    stages: int
    formula: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    """Rows for the schedules that ran, notes for those skipped."""

    ranks: int
    microbatches: int
    semantics: str
    unit: str
    rows: list[CompareRow] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def compare(ranks: int, microbatches: int, costs: CostModel | None = None,
            link: LinkModel | None = None, comm: CommModel | None = None,
            schedules: list[str] | None = None, memory: MemoryModel | None = None,
            params: dict[str, dict] | None = None) -> Comparison:
    """Simulate each schedule (default: every registered one) and collect its numbers.

    A schedule whose generator rejects (ranks, microbatches) or whose program deadlocks
    under ``comm`` is skipped with the reason in ``skipped``. ``params`` gives extra
    generator parameters per schedule name. Raises :class:`ScenarioError` for a name that
    is not registered (only when ``schedules`` is given).
    """
    from schedsim.generators import get, names
    from schedsim.sim.simulate import simulate

    costs = costs or CostModel()
    link = link or LinkModel()
    comm = comm or CommModel()
    memory = memory or MemoryModel()
    todo = schedules if schedules is not None else names()
    for n in todo:
        get(n)    # unknown names fail loudly
    out = Comparison(ranks, microbatches, comm.semantics, costs.unit)
    for name in todo:
        data = {"schedule": {"name": name, "ranks": ranks, "microbatches": microbatches,
                             **(params or {}).get(name, {})},
                "costs": costs.model_dump(), "link": link.model_dump(),
                "comm": comm.model_dump()}
        try:
            prog = parse_scenario(data, f"compare {name}").build_program()
        except SchedsimError as e:
            out.skipped[name] = str(e)
            continue
        tl = simulate(prog, costs, link, comm, raise_on_deadlock=False)
        if tl.deadlock is not None:
            out.skipped[name] = f"deadlocks under {comm.semantics}: {tl.deadlock.message}"
            continue
        bm = bubble_metrics(tl)
        f = TABLE_FORMULAS.get(name)
        frm = None
        if f is not None:
            pp = f.pp(ranks)
            frm = {"PP": pp, "idle": f.idle, "idle_value": f.idle_fn(pp, costs),
                   "activation": f.activation, "activation_value": f.activation_fn(pp),
                   "activation_unit": "stage activations" if pp == ranks else
                   "chunk activations", "params": f.params}
        out.rows.append(CompareRow(name, tl.makespan, bm["idle"], bm["bubble_ratio"],
                                   bm["span_bubble_rate"], peak_activation(tl, memory),
                                   param_memory(prog.placement), prog.placement.stages,
                                   frm))
    return out


def spread(values: list[float]) -> str:
    """``6`` when all equal, else ``min..max``."""
    from schedsim.analysis._index import fmt_t

    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt_t(lo) if abs(hi - lo) < 1e-9 else f"{fmt_t(lo)}..{fmt_t(hi)}"
