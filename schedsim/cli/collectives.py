"""The stage model on the command line: the derived-cost table ``simulate`` prints for a
scenario with ``[model]``, ``compare --model-overlap`` (one comparison per overlap mode,
with the makespan gain) and ``schedsim check-collectives`` (the autograd check of the
ways to write a tensor-parallel all-reduce)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_time  # noqa: F401
from schedsim.cli.common import console, fail, handle_errors
from schedsim.util.units import fmt_bubble, fmt_time, unit_title, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario
    from schedsim.timeline import Timeline


def model_summary(sc: Scenario) -> str:
    """One line describing ``sc``'s stage model (typed in ``[model]`` or derived from
    ``[workload]``)."""
    sco = sc.stage_costs()
    assert sco is not None
    m = sco.model
    moe = f", MoE ep {m.ep} top-{m.topk}" if m.moe else ""
    per = "" if not m.stage else (" (stage " + ", ".join(
        f"{s}: {o.layers}" for s, o in sorted(m.stage.items()) if o.layers is not None)
        + ")")
    return (f"stage model: {m.layers} layers/stage{per}, tp {m.tp}{moe}, sequence "
            f"parallel {'on' if m.sequence_parallel else 'off'}, overlap {m.overlap}")


def print_stage_costs(sc: Scenario, stages: int, tl: Timeline | None = None) -> None:
    """Print the derived cost of every kind per stage group (compute, collectives, the
    exposed and hidden collective time) and, with ``tl``, the exposed collective time per
    kind summed over the run. ``stages``: the program's stage count (to name the stages a
    default row stands for)."""
    from rich.markup import escape
    from schedsim.sim.pieces import exposed_by_kind
    from schedsim.sweep import stage_cost

    sco = sc.stage_costs()
    if sco is None:
        return
    default_stage = next((s for s in range(stages) if s not in sco.model.stage), None)
    t = DataTable("stages",
                  title=escape(model_summary(sc)) + f" ({sc.costs.unit})",
                      unit=sc.costs.unit)
    for col in ("stages", "kind", "cost", "compute", "collective", "exposed", "hidden",
                "used"):
        t.add_column(col, justify="left" if col in ("stages", "kind", "used") else "right",
                     no_wrap=True)
    for label, kind, oc in sco.table():
        st = default_stage if label in ("all", "default") else int(label)
        used = "-" if st is None else stage_cost(sc.costs, kind, st)
        how = "-" if st is None else ("derived" if abs(used - oc.cost) <= 1e-9 * max(
            1.0, oc.cost) else f"typed: {fmt_time(used)}")
        t.add_row(label, kind, *(num_time(x) for x in (
            oc.cost, oc.compute, oc.collective, oc.exposed, oc.hidden)), how)
    console.print(t)
    if tl is not None and tl.deadlock is None:
        rows = exposed_by_kind(tl, sco)
        if rows:
            u = sc.costs.unit
            parts = [f"{k} {fmt_time(v['exposed'])} of {with_unit(v['collective'], u)} "
                     f"({v['ops']:g} ops)" for k, v in sorted(rows.items())]
            console.print("exposed collective time over the run, per kind: "
                          + "; ".join(parts), highlight=False, soft_wrap=True)


# -- compare --model-overlap -------------------------------------------------------------
def print_overlap_comparison(res: Any, json_out: Path | None) -> None:
    """``compare --model-overlap none,fb``: print an
    :class:`~schedsim.sweep.OverlapComparison` (one table, then per schedule the makespan
    gain of each mode over the first) and write its records to ``json_out``."""
    from rich.markup import escape

    t = DataTable("overlap_modes",
                  title=unit_title(f"{res.ranks} ranks x {res.microbatches} microbatches, "
                                   f"{res.semantics} semantics, costs from the stage model by "
                                   f"overlap mode", res.unit))
    for col in ("schedule", "overlap", "F", "BW", "FB", "makespan", "bubble"):
        t.add_column(col, justify="left" if col in ("schedule", "overlap") else "right")
    for r in res.records:
        t.add_row(r["schedule"], r["overlap"], num_time(r["F"]), num_time(r["BW"]),
                  num_time(r["FB"]), num_time(r["makespan"]),
                  num(r["bubble_ratio"], fmt_bubble(r["bubble_ratio"])))
    console.print(t)
    first = res.modes[0]
    base = {r["schedule"]: r["makespan"] for r in res.records if r["overlap"] == first}
    for rec in res.gains():
        gain = rec["gain_over_" + first]
        b = base[rec["schedule"]]
        pct = f" ({100 * gain / b:.1f}%)" if b > 0 else ""
        console.print(f"{rec['schedule']}: makespan {with_unit(b, res.unit)} ({first}) -> "
                      f"{with_unit(rec['makespan'], res.unit)} ({rec['overlap']}): gain "
                      f"{with_unit(gain, res.unit)}{pct}", highlight=False)
    for n, why in res.skipped.items():
        console.print(f"skipped {n}: {escape(why)}", highlight=False, soft_wrap=True)
    if json_out is not None:
        from schedsim.cli.analysis import write_json

        write_json(json_out, res.records)


# -- check-collectives -------------------------------------------------------------------
@app.command("check-collectives")
@handle_errors(tables=True)
def check_collectives(
    tp: Annotated[int, typer.Option("--tp", min=2, max=16, help="Tensor-parallel ranks "
                                    "(gloo processes).")] = 2,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write {tp, variants: [...], findings: [...]} here.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds for the whole run, "
                                           "process start included.")] = 120.0,
    function: Annotated[Optional[str], typer.Option(
        "--function", metavar="MODULE:NAME|FILE.py:NAME", help="Check your own reduction "
        "(an autograd Function or a callable of one tensor; the group is the default "
        "process group) as the g after a row-parallel linear, instead of the built-in "
        "variants.")] = None,
    input_function: Annotated[Optional[str], typer.Option(
        "--input-function", metavar="MODULE:NAME|FILE.py:NAME", help="With --function: "
        "your f before the column-parallel linear (default: Megatron's f, identity "
        "forward and all-reduce backward).")] = None,
) -> None:
    """Run tiny column- and row-parallel layers on --tp gloo processes (float64) under
    each way of writing the tensor-parallel all-reduce; fit every gradient against the
    single-process gradient of the replicated loss and of the loss summed over ranks.

    A scale of 1.0 for the replicated loss is what Megatron's f/g give; an 'x.grad = 4 on
    4 ranks' (an AllReduce that all-reduces in forward and backward) is the gradient of
    the summed loss (4x the replicated one). Also reports the saved-tensor hazard: a raw
    in-place all-reduce on a tensor autograd saved gives a wrong gradient without an
    error.

    --function checks your own operator: the gradient scale of every parameter and of
    the input, and the bug class (missing backward all-reduce, all-reduce twice,
    in-place on a saved tensor) with the facts behind it.

    Examples:
      schedsim check-collectives --tp 4 --json collectives.json
      schedsim check-collectives --function mypkg.tp:AllReduce --tp 4

    Exit codes: 0 ok, 1 a rank failed or timed out, 2 bad input.
    """
    from schedsim.replay.config import require_torch
    from schedsim.util.files import check_output_path

    require_torch()
    if json_out is not None:
        check_output_path(json_out)
    if not timeout > 0:
        fail("--timeout must be > 0 seconds")
    if function is not None or input_function is not None:
        return _check_function(function, input_function, tp, timeout, json_out)
    from schedsim.replay.collectives_check import run_check

    res = run_check(tp, timeout)
    print_check(res)
    if json_out is not None:
        from schedsim.cli.analysis import write_json

        write_json(json_out, res)


def print_check(res: dict[str, Any]) -> None:
    """Print the table and findings of a :func:`run_check` result."""
    from rich.markup import escape

    n = res["tp"]
    t = DataTable("grad_scale",
                  title=f"gradient scale vs the single-process reference, tp = {n} (float64; "
                        f"1.0 = equal, {n}.0 = {n}x)")
    for col in ("variant", "replicated loss", "summed loss", "correct for"):
        t.add_column(col, justify="right" if "loss" in col else "left", no_wrap=True)

    def sc(x: float | None) -> str:
        return "not a multiple" if x is None else str(round(x, 12))

    for v in res["variants"]:
        t.add_row(v["name"], sc(v["scale_replicated_loss"]), sc(v["scale_summed_loss"]),
                  v["correct_for"])
    console.print(t)
    for v in res["variants"]:
        console.print(f"[bold]{v['name']}[/]: {escape(v['note'])}", highlight=False,
                      soft_wrap=True)
    for f in res.get("findings", []):
        console.print(f"finding [bold]{escape(f['name'])}[/]: {escape(f['note'])}",
                      highlight=False, soft_wrap=True)


def _check_function(function: str | None, input_function: str | None, tp: int,
                    timeout: float, json_out: Path | None) -> None:
    """``check-collectives --function``: measure, print the scales and the verdict."""
    from rich.markup import escape
    from schedsim.replay.collective_api import check_collective

    if function is None:
        fail("--input-function checks an f with your g: add --function MODULE:NAME")
    res = check_collective(function, tp, f=input_function, timeout=timeout)
    console.print(f"g = {escape(function)}, f = "
                  f"{escape(input_function or 'Megatron f (default)')}", highlight=False,
                  soft_wrap=True)
    t = DataTable("grad_scale_tensors",
                  title=f"gradient scale vs the single-process reference, tp = {tp}")
    for col in ("tensor", "replicated loss", "summed loss"):
        t.add_column(col, justify="left" if col == "tensor" else "right")

    def sc(x: float | None) -> str:
        return "not a multiple" if x is None else str(round(x, 12))

    for name, row in res.tensors.items():
        t.add_row(name, sc(row["replicated"]), sc(row["summed"]))
    console.print(t)
    scale = "" if res.scale is None else f" (scale {res.scale:g})"
    console.print(f"verdict: [bold]{escape(res.verdict)}[/]{scale}", highlight=False)
    for line in res.why:
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    for line in res.hazards:
        console.print(f"hazard: {escape(line)}", highlight=False, soft_wrap=True)
    if json_out is not None:
        from schedsim.cli.analysis import write_json

        write_json(json_out, res.to_dict())
