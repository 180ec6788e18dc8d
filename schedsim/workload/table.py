"""A scenario's ``[workload]`` table with its ``[schedule]``: what each fills in for the
other.

- ``[schedule] ranks`` follows from ``pp`` and ``pp`` from ``ranks`` (whichever is given;
  both: they must agree);
- ``[schedule] microbatches`` follows from the batch (``global_batch_size /
  (micro_batch_size x dp)``; given: it must agree);
- the workload's ``chunks`` is the stages per rank the generator builds (a V schedule:
  2); a ``chunks`` given in ``[workload]`` is passed to a generator that takes it
  (:func:`workload_params`, when the program is built);
- the costs are the derived ones in ms (a kind typed in ``[costs]`` still wins, in ms;
  a ``[costs] unit`` other than ``ms`` is refused),
  the P2P links the pipeline's unless ``[link]`` sets them.

Raises :class:`~schedsim.errors.ScenarioError` (a :class:`WorkloadError` for a broken
rule) naming the disagreement.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from schedsim.errors import ScenarioError
from schedsim.workload.layout import Workload, WorkloadError, workload_from_dict


def resolve_workload(table: dict[str, Any], schedule: Any,
                     flags: dict[tuple[str, str], str] | None = None) -> Workload:
    """The checked :class:`Workload` of ``table`` (the ``[workload]`` dict) given the
    scenario's ``schedule`` section (a ``ScheduleSection``), whose ``ranks`` and
    ``microbatches`` it fills in place without marking them as set.
    ``flags``: the ``(table, key)`` a command-line flag set -> the flag's field name
    (:func:`schedsim.scenario.parse_scenario`); a ``ranks`` or ``microbatches`` a flag set
    that disagrees with the workload is a :class:`~schedsim.errors.FlagError` naming the
    flag (``-p``/``-m``), else a :class:`WorkloadError` / :class:`ScenarioError` naming
    the ``[schedule]`` key."""
    from schedsim.errors import FlagError
    from schedsim.generators import generated_stages, get

    data = dict(table)
    if "pp" not in data and schedule.ranks is not None:
        data["pp"] = schedule.ranks
    params = schedule.generator_params()
    if schedule.name and "chunks" not in data:
        gen = get(schedule.name)
        pp = int(data.get("pp", 1)) if str(data.get("pp", 1)).isdigit() else 1
        data["chunks"] = max(1, generated_stages(gen, pp, params) // pp)
    w = workload_from_dict(data).check()
    flag_of = flags or {}
    if schedule.ranks is not None and schedule.ranks != w.pp:
        flag = flag_of.get(("schedule", "ranks"))
        if flag is not None:
            raise FlagError(flag, f"{schedule.ranks} but the scenario's [workload] pp = "
                            f"{w.pp} (its pipeline ranks): drop the flag, or change pp")
        raise WorkloadError("layers fill pp x chunks stages",
                            f"[schedule] ranks = {schedule.ranks} but [workload] pp = {w.pp}: "
                            f"drop one")
    if schedule.microbatches is not None and schedule.microbatches != w.microbatches:
        runs = (f"the workload runs global_batch_size / (micro_batch_size x dp) = "
                f"{w.global_batch_size} / ({w.micro_batch_size} x {w.data_parallel}) = "
                f"{w.microbatches}")
        flag = flag_of.get(("schedule", "microbatches"))
        if flag is not None:
            raise FlagError(flag, f"{schedule.microbatches} but {runs}: drop the flag, or "
                            f"change global_batch_size")
        raise ScenarioError(f"[schedule] microbatches = {schedule.microbatches} but {runs}: "
                            f"drop microbatches")
    object.__setattr__(schedule, "ranks", w.pp)
    object.__setattr__(schedule, "microbatches", w.microbatches)
    return w


def workload_params(table: dict[str, Any], gen: Any, params: dict[str, Any],
                    w: Workload) -> dict[str, Any]:
    """``params`` (a generator's, from ``[schedule]``) with the ``chunks`` a ``[workload]``
    ``table`` gives, for a generator ``gen`` that takes them and a ``[schedule]`` that
    does not set them: added when the program is built, not to the ``[schedule]`` table,
    so that a scenario read again under another ``-s`` does not carry them (``-s 1f1b``
    on an interleaved workload scenario read "'1f1b' takes no parameter 'chunks'")."""
    if "chunks" in table and "chunks" in gen.accepted() and "chunks" not in params:
        return {**params, "chunks": w.chunks}
    return params


def check_costs_unit(costs: Any) -> None:
    """A ``[workload]`` derives its costs in ms, so a ``[costs] unit`` other than ``ms``
    beside it (``unit = "slot"`` printed ms costs as slots) is refused: a
    :class:`ScenarioError` naming both tables and the key to remove. ``unit = "ms"``
    agrees and passes (a ``schedsim calibrate`` cost file writes it)."""
    if "unit" in costs.model_fields_set and costs.unit != "ms":
        raise ScenarioError(f"[costs] unit = {costs.unit!r} beside a [workload]: the "
                            f"workload derives its costs in ms (a kind typed in [costs] "
                            f"is read in ms too); remove unit from [costs]")


def apply_workload(sc: Any, flags: dict[tuple[str, str], str] | None = None) -> Workload:
    """Fill the scenario ``sc`` from its ``[workload]`` (a ``model`` path relative to the
    scenario's folder): the schedule's sizes
    (:func:`resolve_workload`), the derived costs in ms under the kinds ``[costs]``
    types (in ms: :func:`check_costs_unit`) and, unless ``[link]`` sets something, the
    pipeline links. ``flags``: as :func:`resolve_workload` takes them. Returns the
    workload. Raises :class:`ScenarioError` when ``[model]`` is given too or ``[costs]
    unit`` is not ``ms``."""
    from schedsim.workload.derive import placement_free_models

    if sc.model is not None:
        raise ScenarioError("[workload] and [model] both give the stage model: keep "
                            "[workload] (it derives the stage model from the model config "
                            "and the GPU) or [model]")
    from schedsim.workload.presets import MODELS

    table = dict(sc.workload or {})
    model = table.get("model")
    if isinstance(model, str) and model.lower() not in MODELS:
        table["model"] = str(sc.resolve(model))     # a config.json beside the scenario
    check_costs_unit(sc.costs)
    w = resolve_workload(table, sc.schedule, flags)
    costs, link = placement_free_models(w, connections=sc.comm.connections)
    derived = sc.costs.with_derived(costs._derived, costs.message_bytes)
    if "unit" not in sc.costs.model_fields_set:
        object.__setattr__(derived, "unit", "ms")      # derived, so left unset in a dump
    sc.costs = derived
    if not sc.link.model_fields_set:
        object.__setattr__(link, "__pydantic_fields_set__", set())   # likewise
        sc.link = link
    return w



def derive_scenario(sc: Any, placement: Any) -> Any:
    """:func:`schedsim.workload.derive.derive` of the scenario's workload on
    ``placement``, with the scenario's costs (typed kinds included) and links."""
    from schedsim.workload.derive import derive

    d = derive(sc.workload_model(), placement)
    d.costs, d.link = sc.costs, sc.link
    return d


class PlannerMemory(NamedTuple):
    """What a size limit gives the memory-limited planners (zb-1p, zb-2p, zbv):
    ``limit`` their ``mem_limit`` (``M_B``, microbatches' worth: one microbatch is
    ``chunks`` chunk forwards), ``deltas`` their ``mem_deltas`` ``(F, B, W)`` of a chunk
    pass, ``F`` = 1 (None: a plain number, the planner's default deltas apply),
    ``per_rank`` each rank's own limit (``limit`` is their smallest; None with a plain
    number)."""

    limit: float
    deltas: tuple[float, float, float] | None = None
    per_rank: tuple[float, ...] | None = None


#: the B-stash fraction of the planners' deltas is rounded up to a multiple of this, so
#: that ``1 - f`` and ``f`` are exact and ``F + B + W`` is exactly 0 (their rule)
_FRACTION_STEP = 2.0 ** -20


def size_mem_limit(sc: Any, flags: dict[tuple[str, str], str] | None = None
                   ) -> PlannerMemory | None:
    """``[schedule] mem_limit`` (``--mem-limit``) given as a size (``"76GiB"``: bytes per
    GPU, :func:`schedsim.util.units.parse_size`) as the planners' activation limit in
    microbatches' worth (``M_B``) and their F/B/W deltas, through the scenario ``sc``'s
    workload (:func:`planner_memory`); a number as text (``"4"``) as that number (deltas
    None); None when ``mem_limit`` is unset or a number already. Raises :class:`ScenarioError` (a
    :class:`~schedsim.errors.FlagError` naming ``--mem-limit`` when the flag set it) for
    a bad text, a size without a ``[workload]``, or a size that holds less than one
    microbatch."""
    from schedsim.errors import FlagError
    from schedsim.util.units import parse_size

    text = (sc.schedule.model_extra or {}).get("mem_limit")
    if not isinstance(text, str):
        return None
    flag = (flags or {}).get(("schedule", "mem_limit"))
    what = "--mem-limit" if flag is not None else "[schedule] mem_limit"

    def refuse(reason: str) -> None:
        if flag is not None:
            raise FlagError(flag, reason)
        raise ScenarioError(f"{what} {text!r}: {reason}")

    try:
        nbytes, is_bytes = parse_size(text, what)
    except ScenarioError as e:
        if flag is not None:
            raise FlagError(flag, str(e)) from None
        raise
    if not is_bytes:
        return PlannerMemory(nbytes)
    w = sc.workload_model()
    if w is None or not sc.schedule.name:
        refuse(f"{text} is bytes per GPU, which only a scenario's [workload] (model and "
               f"GPU) converts to microbatches' activations; without one give a number of "
               f"microbatches (e.g. 4)")
    from schedsim.workload.hardware import mem_limit_above_hbm

    above = mem_limit_above_hbm(nbytes, w.gpu)      # the one rule (plan's too)
    if above is not None:
        refuse(above)
    try:
        return planner_memory(w, sc.schedule.name, sc.schedule.generator_params(), nbytes)
    except WorkloadError as e:
        refuse(f"{text}: {e}")
    raise AssertionError("unreachable")          # pragma: no cover


def mem_limit_microbatches(w: Workload, schedule_name: str, params: dict[str, Any],
                           nbytes: float) -> float:
    """:func:`planner_memory`'s ``limit``."""
    return planner_memory(w, schedule_name, params, nbytes).limit


def planner_memory(w: Workload, schedule_name: str, params: dict[str, Any],
                   nbytes: float) -> PlannerMemory:
    """``nbytes`` of memory per GPU as the memory-limited planners' (zb-1p, zb-2p, zbv)
    limit and F/B/W deltas, from the workload ``w``'s stage bytes under the generator's
    placement (``params`` its parameters).

    Deltas: the simulator's own rule (:func:`schedsim.workload.run.pass_deltas`: F
    stores ``stored``, B frees all but the W-stash ``stash_w``, W frees the stash) in
    units of a chunk pass's ``stored``, with the largest ``stash_w / stored`` of any
    stage (B frees the least), rounded up: ``(1, -(1 - f), -f)``. (The authors' default
    ``(2, -1, -1)``, B frees half, let the planner run too many forwards ahead: a
    llama3.1-70b B frees 0.5% of its stored activations.)

    Limit, per pipeline rank r (``per_rank``; ``limit`` the tightest rank's):
    ``(nbytes - reserved_r) / (k x u_r)`` with ``u_r`` the largest ``stored`` of the
    rank's ``k`` stages. ``reserved_r``:
    static state (parameters, gradients, optimizer states, FSDP copies:
    :func:`~schedsim.workload.memory.static_bytes`), P2P receive buffers, the largest
    backward working set of its stages (live during one B, on top of the stored
    activations) and, with ``d.stage_held`` (torchtitan), the FSDP copies (gathered
    parameters, unsharded and sharded gradients) and the outputs / input gradients torch
    pipelining keeps per microbatch to the step end, all ``microbatches`` of them.

    Guarantee: an F/B/W schedule whose stored activations the planner keeps within
    ``limit`` (it refuses otherwise) peaks at most ``nbytes`` per rank in the simulator's
    byte accounting (:func:`~schedsim.workload.run.byte_levels`): every term above is a
    bound on what that accounting holds at any moment. It is conservative by the spread
    of ``stored`` / ``stash_w`` between a rank's stages and the held bytes' lifetimes.

    Raises :class:`WorkloadError` (rule ``sizes``) when a rank is left less than one
    microbatch."""
    from schedsim.generators import generated_stages, get
    from schedsim.program.ir import Placement
    from schedsim.util.units import fmt_gib
    from schedsim.workload.derive import derive
    from schedsim.workload.run import pass_deltas

    gen = get(schedule_name)
    kind = gen.placement.split()[0]
    pl = Placement(kind=kind, ranks=w.pp, stages=generated_stages(gen, w.pp, params))
    d = derive(w, pl)
    frac = 0.0
    for b in d.stage_bytes:
        f_, b_, w_ = pass_deltas(b.stored, b.stash_w)
        if f_ > 0:
            frac = max(frac, -w_ / f_)
    frac = min(1.0, math.ceil(frac / _FRACTION_STEP) * _FRACTION_STEP)
    rows = []
    for r in range(w.pp):
        stages = pl.stages_of(r)
        act = len(stages) * max(d.stage_bytes[s].stored for s in stages)
        base = (d.static[r].total + d.recv_bytes[r]
                + max(d.stage_bytes[s].working for s in stages))
        if d.stage_held is not None:        # torchtitan: FSDP copies held over the step
            base += sum(h.gathered + h.grads + h.sharded_grads + w.microbatches * (
                h.output + h.output_after_backward + h.input_grad)
                for h in (d.stage_held[s] for s in stages))
        rows.append(((nbytes - base) / act if act > 0 else float("inf"), r, base, act))
    limit, r, base, act = min(rows)
    if not limit >= 1:
        held = " and held bytes" if d.stage_held is not None else ""
        raise WorkloadError("sizes", f"rank {r}'s static bytes, buffers, backward working "
                            f"set{held} ({fmt_gib(base)}) leave "
                            f"{fmt_gib(max(0.0, nbytes - base))} of {fmt_gib(nbytes)}, less "
                            f"than one microbatch's activations ({fmt_gib(act)}): give "
                            f"more memory, or a number of microbatches")
    return PlannerMemory(limit, (1, -(1 - frac), -frac), tuple(x[0] for x in rows))


def schedule_sizes_hint(w: Workload, name: str, params: dict[str, Any]) -> str | None:
    """What to change in the ``[workload]`` when schedule ``name``'s generator refuses the
    ranks and microbatches it sets (``ranks = pp``, ``microbatches = global_batch_size /
    (micro_batch_size x dp)``): the smallest ``global_batch_size`` whose microbatches the
    generator takes at the same ``pp`` (each count above the workload's tried in turn, a
    refusal costs nothing: the generators check their sizes first), else the settings
    that decide the sizes. ``params``: the generator's parameters as the program was
    built with them. The text follows the generator's own reason after ``; ``. None
    when the generator takes these sizes (the refusal is a parameter's, or the comm
    policy's)."""
    from schedsim.errors import LimitError, ScheduleError
    from schedsim.generators import generate, generated_stages, get
    from schedsim.util.limits import check_program_size

    gen = get(name)
    own = {k: v for k, v in params.items() if k in gen.accepted()}
    stages = generated_stages(gen, w.pp, own)
    m, per, dp = w.microbatches, w.micro_batch_size * w.data_parallel, w.data_parallel

    def takes(k: int) -> bool:
        try:        # (a count above the work limits is not built to be tried)
            check_program_size(name, ranks=w.pp, microbatches=k, stages=stages)
            generate(name, w.pp, k, **own)
        except (ScheduleError, LimitError):
            return False
        return True

    sets = (f"[workload] sets ranks = pp = {w.pp} and microbatches = global_batch_size / "
            f"(micro_batch_size x dp) = {w.global_batch_size} / ({w.micro_batch_size} x "
            f"{dp}) = {m}")
    if takes(m):            # not the sizes (a parameter, the comm policy): no size hint
        return None
    tries = list(range(m + 1, m + 1 + max(64, 4 * w.pp))) + [m * 2 ** i for i in range(1, 5)]
    need = next((k for k in sorted(set(tries)) if takes(k)), None)
    if need is None:
        return f"{sets}: change pp"
    return (f"{sets}: raise global_batch_size to >= {need * per} ({need} microbatches)"
            f"{' or lower micro_batch_size' if w.micro_batch_size > 1 else ''}, or change pp")
