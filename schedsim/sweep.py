"""Multi-schedule runs: makespan, idle, bubble, activation and parameter memory, side by side.

Runs every registered generator (or a chosen list) at one (ranks, microbatches) and one
cost model, skipping with a note those whose constraints reject the size; each row is
computed by simulation, not derived by hand. This is the table DualPipe's README
("Pipeline Bubbles and Memory Usage Comparison") and the zero-bubble paper print; for the
schedules that table lists, :data:`TABLE_FORMULAS` gives its closed form to print beside
the simulated value.

Two readings of the costs (:func:`compare_schedules`'s ``per_rank_costs``):

- **per rank** (default): the costs are one rank's share of the model, so every schedule
  does equal model work per rank; a schedule with S stages on P ranks runs each op at
  P/S of the given cost (a V schedule's two chunks per rank cost half each);
- **per op**: every op costs the given cost whatever the number of stages (DualPipe's
  table, "based on the same number of PP stages", counts DualPipeV this way).

Each schedule is generated, lowered and simulated once (a planner that takes the costs
plans with the costs it runs at), optionally in worker processes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from schedsim.analysis.memory import MemoryModel, param_memory, peak_activation_run
from schedsim.analysis.metrics import bubble_metrics
from schedsim.errors import ScenarioError, SchedsimError
from schedsim.generators import generated_stages
from schedsim.scenario import parse_scenario
from schedsim.scenario_flags import parse_value
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
    model — a DualPipe rank holds 2). ``cost_scale``: the factor its op costs ran at."""

    schedule: str
    makespan: float
    idle: list[float]
    bubble_ratio: float
    span_bubble_rate: float
    peak_activation: list[float]
    param_memory: list[float]
    stages: int
    formula: dict | None = None
    cost_scale: float = 1.0
    #: the run itself (only when :func:`compare_schedules` was asked to keep it; not in to_dict)
    timeline: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(replace(self, timeline=None))
        del d["timeline"]
        return d


@dataclass
class Comparison:
    """Rows for the schedules that ran, notes for those skipped."""

    ranks: int
    microbatches: int
    semantics: str
    unit: str
    rows: list[CompareRow] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    per_rank_costs: bool = True


def scaled_costs(costs: CostModel, k: float) -> CostModel:
    """``costs`` with every compute cost (defaults, per-stage and per-op overrides)
    multiplied by ``k``; message bytes and the unit unchanged."""
    if k == 1:
        return costs
    d = costs.model_dump()
    for table in [d, *d["stage"].values()]:
        for n in ("F", "B", "W", "BW", "FB"):
            if table[n] is not None:
                table[n] *= k
    for o in d["overrides"]:
        o["cost"] *= k
    return CostModel.model_validate(d)


@dataclass(frozen=True)
class _Job:
    """One schedule of a sweep (picklable: it may run in a worker process)."""

    name: str
    ranks: int
    microbatches: int
    costs: CostModel
    link: LinkModel
    comm: CommModel
    memory: MemoryModel
    params: dict
    per_rank_costs: bool
    label: str = ""
    keep: bool = False


def parse_schedules(text: str | Sequence[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, name, params)`` per schedule of a ``--schedules`` list: comma-separated
    names, each optionally followed by ``:KEY=VALUE`` generator or comm-policy parameters
    (``interleaved-1f1b:chunks=4,zbv,dualpipe``; more parameters of one schedule follow
    after commas, ``interleaved-1f1b:chunks=4,variant=megatron``, or colons). The label
    is the name with its parameters as written. Raises :class:`ScenarioError` for an
    empty name, a parameter without ``=``, or two schedules with one label."""
    from schedsim.errors import ScenarioError

    items = (text if isinstance(text, str) else ",".join(text)).split(",")
    out: list[tuple[str, str, dict[str, Any]]] = []
    for raw in (i.strip() for i in items):
        if not raw:
            continue
        name, _, rest = raw.partition(":")
        if "=" in name and out:          # KEY=VALUE after a comma: the previous one's
            name, rest = "", raw
        elif "=" in name:
            raise ScenarioError(f"bad --schedules item {raw!r}: a parameter needs a "
                                f"schedule before it, e.g. interleaved-1f1b:chunks=4")
        params = {}
        for kv in (x for x in rest.split(":") if x.strip()):
            if "=" not in kv:
                raise ScenarioError(f"bad --schedules parameter {kv!r} of {raw!r}: expected "
                                    f"KEY=VALUE, e.g. interleaved-1f1b:chunks=4")
            k, v = kv.split("=", 1)
            params[k.strip().replace("-", "_")] = parse_value(v)
        if not name:
            label, prev, ps = out.pop()
            out.append((f"{label},{raw}", prev, {**ps, **params}))
        else:
            out.append((raw, name.strip(), params))
    labels = [lb for lb, _, _ in out]
    dup = next((lb for lb in labels if labels.count(lb) > 1), None)
    if dup is not None:
        raise ScenarioError(f"--schedules names {dup!r} twice: give each schedule once")
    return out


def _program(job: _Job, costs: CostModel):
    return parse_scenario({"schedule": {"name": job.name, "ranks": job.ranks,
                                        "microbatches": job.microbatches, **job.params},
                           "costs": costs.model_dump(), "link": job.link.model_dump(),
                           "comm": job.comm.model_dump()},
                          f"compare {job.name}").build_program()


def run_job(job: _Job) -> CompareRow | str:
    """Generate, lower and simulate one schedule: its row, or why it was skipped."""
    from schedsim.generators import get
    from schedsim.sim.simulate import simulate_run

    try:
        # the stages (hence the cost scale) come from the generator's placement before
        # anything is generated: a cost-aware planner plans once, at its op costs
        gen = get(job.name)
        stages = generated_stages(gen, job.ranks, job.params)
        for _ in range(2):      # twice only if the placement's stage count was wrong
            k = job.ranks / stages if job.per_rank_costs else 1.0
            costs = scaled_costs(job.costs, k)
            prog = _program(job, costs if "costs" in gen.accepted() else job.costs)
            if prog.placement.stages == stages:
                break
            stages = prog.placement.stages
    except SchedsimError as e:
        return str(e)
    tl, cp, st = simulate_run(prog, costs, job.link, job.comm, raise_on_deadlock=False)
    if tl.deadlock is not None:
        return f"deadlocks under {job.comm.semantics}: {tl.deadlock.message}"
    bm = bubble_metrics(tl)
    peak = peak_activation_run(cp, st, job.memory)     # from the arrays: no span objects
    if job.keep:
        tl.schedule = job.label or job.name
    return CompareRow(job.label or job.name, tl.makespan, bm["idle"], bm["bubble_ratio"],
                      bm["span_bubble_rate"], peak,
                      param_memory(prog.placement), prog.placement.stages,
                      _formula(job.name, job.ranks, costs), k,
                      tl if job.keep else None)


def _formula(name: str, ranks: int, costs: CostModel) -> dict | None:
    """The DualPipe table's closed form for ``name`` at the op costs it ran at."""
    f = TABLE_FORMULAS.get(name)
    if f is None:
        return None
    pp = f.pp(ranks)
    return {"PP": pp, "idle": f.idle, "idle_value": f.idle_fn(pp, costs),
            "activation": f.activation, "activation_value": f.activation_fn(pp),
            "activation_unit": "stage activations" if pp == ranks else "chunk activations",
            "params": f.params}


#: total instructions (ranks x microbatches x schedules, roughly) above which ``jobs=0``
#: runs the schedules in worker processes
PARALLEL_WORK = 200_000


def compare_schedules(ranks: int, microbatches: int, costs: CostModel | None = None,
            link: LinkModel | None = None, comm: CommModel | None = None,
            schedules: list[str] | None = None, memory: MemoryModel | None = None,
            params: dict[str, dict] | None = None, *, per_rank_costs: bool = True,
            jobs: int = 1, keep_timelines: bool = False) -> Comparison:
    """Simulate each schedule (default: every registered one) and collect its numbers.

    ``per_rank_costs``: the costs are one rank's share of the model (module docstring);
    False: every op costs the given cost (always so for costs a stage model derives,
    which fix each stage's layers; ``Comparison.per_rank_costs`` says which applied). A
    schedule whose generator rejects (ranks, microbatches) or whose program deadlocks
    under ``comm`` is skipped with the reason in ``skipped``. ``schedules`` entries may
    carry parameters, ``"interleaved-1f1b:chunks=4"`` (:func:`parse_schedules`; the row
    is labelled so); ``params`` gives extra generator or comm-policy parameters per
    schedule name, for every entry of that name (its own parameters win).
    ``keep_timelines``: each row keeps its run (``CompareRow.timeline``, its schedule
    named by the label). ``jobs``: worker processes (1: in this
    process; 0: as many as CPUs when the sweep is large, :data:`PARALLEL_WORK`). Rows
    come in the order of ``schedules`` either way. Raises :class:`ScenarioError` for a
    name that is not registered (only when ``schedules`` is given).
    """
    from schedsim.generators import get, names

    costs = costs or CostModel()
    link = link or LinkModel()
    comm = comm or CommModel()
    memory = memory or MemoryModel()
    # a stage model's costs (a scenario's [model]) give each stage its layers: per op
    per_rank_costs = per_rank_costs and getattr(costs, "_derived", None) is None
    todo = parse_schedules(schedules) if schedules is not None else \
        [(n, n, {}) for n in names()]
    from schedsim.generators import generated_stages
    from schedsim.util.limits import check_program_size, check_total_instructions, check_workers

    check_workers("-j", jobs, minimum=0)
    check_program_size("compare", ranks=ranks)
    sizes = []
    for _, n, ps in todo:
        gen = get(n)    # unknown names fail loudly
        sizes.append((generated_stages(gen, ranks, {**(params or {}).get(n, {}), **ps}),
                      microbatches))
    # the work of all schedules together is bounded up front, as one program's is
    check_total_instructions(f"compare of {len(todo)} schedules on {ranks:,} ranks x "
                             f"{microbatches:,} microbatches", sizes)
    work = [_Job(n, ranks, microbatches, costs, link, comm, memory,
                 {**(params or {}).get(n, {}), **ps}, per_rank_costs, label, keep_timelines)
            for label, n, ps in todo]
    out = Comparison(ranks, microbatches, comm.semantics, costs.unit,
                     per_rank_costs=per_rank_costs)
    for job, res in zip(work, _run(work, jobs, ranks * microbatches * len(work))):
        if isinstance(res, str):
            out.skipped[job.label] = res
        else:
            out.rows.append(res)
    return out


def _run(work: list[_Job], jobs: int, size: int) -> list[CompareRow | str]:
    """Results of ``work`` in order, in this process or in ``jobs`` worker processes."""
    import os

    if jobs == 0:
        jobs = (os.cpu_count() or 1) if size >= PARALLEL_WORK else 1
    jobs = min(jobs, len(work))
    from schedsim.sim.simulate import warm_up

    warm_up()       # numba kernels loaded once (forked workers inherit them)
    if jobs <= 1:
        return [run_job(j) for j in work]
    from schedsim.util.signals import worker_pool

    with worker_pool(jobs) as ex:       # quiet workers: a stop is reported once, here
        return list(ex.map(run_job, work))


def spread(values: list[float]) -> str:
    """``6`` when all equal, else ``min..max``."""
    from schedsim.util.units import fmt_time

    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt_time(lo) if abs(hi - lo) < 1e-9 else f"{fmt_time(lo)}..{fmt_time(hi)}"


# -- one comparison per stage-model overlap mode ------------------------------------------
def stage_cost(costs: CostModel, kind: str, stage: int = 0) -> float:
    """The cost a simulation uses for ``kind`` on ``stage`` (microbatch 0; ``FB``: the F
    and BW pair of that stage, :func:`schedsim.sim.pieces.fb_op`), in ``costs.unit``."""
    from schedsim.program.ir import Op
    from schedsim.sim.pieces import fb_op

    return costs.cost(fb_op(stage, stage)) if kind == "FB" else costs.cost(Op(kind, stage, 0))


def overlap_modes(modes: str | Sequence[str]) -> list[str]:
    """The stage-model overlap modes of ``modes`` (``"none,fb"`` or a list), checked: two
    or more of :data:`schedsim.sim.stage_model.Overlap`. Raises :class:`ScenarioError`
    naming the known ones."""
    from typing import get_args

    from schedsim.errors import ScenarioError
    from schedsim.sim.stage_model import Overlap

    given = modes.split(",") if isinstance(modes, str) else list(modes)
    out = [m.strip() for m in given if m.strip()]
    known = get_args(Overlap)
    if any(m not in known for m in out) or len(out) < 2:
        text = modes if isinstance(modes, str) else ",".join(modes)
        raise ScenarioError(f"bad --model-overlap {text!r}: give two or more of "
                            f"{', '.join(known)}, e.g. none,fb")
    return out


@dataclass
class OverlapComparison:
    """:func:`compare_overlap_modes`: one record per (mode, schedule) in mode order,
    ``{schedule, overlap, F, BW, FB, makespan, bubble_ratio}`` (F, BW, FB: stage 0's
    costs under that mode, in ``unit``) plus ``gain_over_<first mode>`` (makespan of the
    first mode minus this one's) on every later mode's record of a schedule the first
    mode ran; ``skipped``: the schedules the first mode skipped, with the reason."""

    ranks: int
    microbatches: int
    semantics: str
    unit: str
    modes: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def gains(self) -> list[dict[str, Any]]:
        """The records that carry a gain over the first mode, in order."""
        return [r for r in self.records if "gain_over_" + self.modes[0] in r]


def compare_overlap_modes(data: dict[str, Any], modes: str | Sequence[str], ranks: int,
                          microbatches: int, schedules: list[str] | None = None,
                          memory: MemoryModel | None = None) -> OverlapComparison:
    """:func:`compare_schedules` once per stage-model overlap mode (:func:`overlap_modes`) of a
    scenario with a ``[model]`` table: ``data`` is the scenario as a dict (the TOML
    tables, flags applied), its ``[model] overlap`` set to each mode in turn, the costs
    derived by the stage model (``compare --model-overlap``). Raises
    :class:`ScenarioError` without a ``[model]`` or for a bad mode list."""
    from schedsim.errors import ScenarioError

    if data.get("model") is None:
        raise ScenarioError("--model-overlap needs a scenario with a [model] table "
                            "(--scenario FILE)")
    modes = overlap_modes(modes)
    out: OverlapComparison | None = None
    first: dict[str, float] = {}
    for mode in modes:
        sc = parse_scenario({**data, "model": {**data["model"], "overlap": mode}},
                            f"--model-overlap {mode}")
        res = compare_schedules(ranks, microbatches, sc.costs, sc.link, sc.comm, schedules, memory)
        if out is None:
            out = OverlapComparison(ranks, microbatches, res.semantics, res.unit, modes,
                                    skipped=dict(res.skipped))
        f, bw, fb = (stage_cost(sc.costs, k) for k in ("F", "BW", "FB"))
        for r in res.rows:
            rec = {"schedule": r.schedule, "overlap": mode, "F": f, "BW": bw, "FB": fb,
                   "makespan": r.makespan, "bubble_ratio": r.bubble_ratio}
            if mode == modes[0]:
                first[r.schedule] = r.makespan
            elif r.schedule in first:
                rec["gain_over_" + modes[0]] = first[r.schedule] - r.makespan
            out.records.append(rec)
    assert out is not None
    return out


# -- the parameters given for every schedule ---------------------------------------------
def params_for_schedules(**given: Any) -> dict[str, dict]:
    """Per schedule name, the parameters given for every schedule (None: not given): a
    generator's own parameters (chunks, variant, mem_limit, group_size...) go to the
    schedules whose generator takes them, the others (the comm policy and its keys) to
    every schedule; :func:`compare_schedules`'s ``params``."""
    from schedsim.generators import GENERATORS, names

    names()         # (every generator module imported: GENERATORS is the whole registry)
    given = {k: v for k, v in given.items() if v is not None}
    gen_keys = {k for g in GENERATORS.values() for k in g.accepted()}
    return {n: {k: v for k, v in given.items() if k not in gen_keys or k in g.accepted()}
            for n, g in GENERATORS.items()}


def none_ran(ran: int, skipped: dict[str, str], where: str) -> None:
    """Refuse a ``compare`` in which no schedule ran (``ran`` rows; ``skipped``: each
    refused schedule and why; ``where``: the size, e.g. ``at 4 ranks x 2 microbatches``):
    an empty table with exit 0 would read as success. Raises :class:`~schedsim.errors.ScenarioError`
    (exit 2), one line with the reasons of up to three schedules, else their names and
    the first reason."""
    if ran:
        return
    if not skipped:
        raise ScenarioError("no schedule to compare: --schedules names none; give names "
                            "from 'schedsim list', e.g. --schedules 1f1b,zbv")
    why = list(skipped.items())
    reasons = "; ".join(f"{n}: {w}" for n, w in why) if len(why) <= 3 else \
        f"all {len(why)} were skipped ({', '.join(skipped)}); the first, {why[0][0]}: " \
        f"{why[0][1]}"
    raise ScenarioError(f"no schedule ran {where}: {reasons}; give a size they accept or "
                        f"other --schedules")
