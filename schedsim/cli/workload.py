"""A scenario's ``[workload]`` on the command line: ``simulate``'s step line and bytes
per rank (:func:`print_workload`; the run: :func:`schedsim.cli.inputs.simulate_scenario`),
``memory`` in GiB (:func:`print_memory_gib`), the ``--model``/``--gpu`` flags
(:func:`with_workload`) and ``schedsim costs`` (the per-stage breakdown)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_gib, num_time  # noqa: F401
from schedsim.cli.common import console, handle_errors, scenario_command, write_text_out
from schedsim.cli.inputs import simulate_scenario
from schedsim.errors import ScenarioError
from schedsim.util.text import number_runs, rich_escape
from schedsim.util.units import (GIB, fmt_bubble, fmt_gib, fmt_mfu, fmt_mib, fmt_rate,
                                  fmt_time, gib_number, with_unit)

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario

ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", help="The \\[workload]'s model: a preset (llama3.1-8b, llama3.1-70b, "
    "llama3.1-405b, deepseek-v3, qwen3-30b-a3b, mixtral-8x7b) or a config.json path.")]
GpuOpt = Annotated[Optional[str], typer.Option(
    "--gpu", help="The \\[workload]'s GPU preset (a100-80gb, h100-sxm, h800, h200, b200, "
    "mi300x).")]


def with_workload(sc: Scenario, **changes: Any) -> Scenario:
    """``sc`` read again with ``changes`` (``model``, ``gpu``; None: unchanged) in its
    ``[workload]`` (everything it derived is derived again). Raises
    :class:`ScenarioError` when it has none."""
    from schedsim.scenario import parse_scenario

    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return sc
    if sc.workload is None:
        verb = "changes" if len(changes) == 1 else "change"
        raise ScenarioError(f"--{' and --'.join(changes)} {verb} a scenario's [workload] "
                            f"table and this run has none: give a scenario with one (model, "
                            f"gpu, seq, global_batch_size, tp, pp, ...: "
                            f"schedules/llama3-70b-h100.toml, docs/workload.md), or from "
                            f"flags alone 'schedsim plan --model M --gpu G --gpus N --seq S "
                            f"--global-batch-size B'")
    from schedsim.errors import FlagError
    from schedsim.workload.hardware import gpu_preset
    from schedsim.workload.model import load_model
    from schedsim.workload.presets import MODELS

    m = changes.get("model")
    if m is not None and m.lower() not in MODELS:      # a config.json from the cwd
        changes["model"] = str(Path(m).resolve())
    # the flag's own value first, so that a refusal names the flag (it read "command
    # line: [workload]: ..." beside a scenario file)
    for flag, check in (("model", load_model), ("gpu", gpu_preset)):
        if flag in changes:
            try:
                check(changes[flag])
            except ScenarioError as e:
                raise FlagError(flag, str(e)) from None
    data = sc.model_dump(exclude={"base_dir"}, exclude_none=True, exclude_unset=True)
    source = " ".join(f"--{k} {v}" for k, v in changes.items())   # what changed it
    data["workload"] = {**data["workload"], **changes}
    return parse_scenario(data, source, sc.base_dir, file=sc.source_file)


def print_workload(res: Any) -> None:
    """The step line and a table of bytes per pipeline rank (GiB)."""
    w = res.derived.workload
    t = DataTable("workload",
                  title=rich_escape(
        f"{w.model.name} on {w.gpus} x {w.gpu.name}: tp {w.tp}, pp {w.pp}, dp "
        f"{w.data_parallel}, ep {w.ep}, {w.microbatches} microbatches of "
        f"{w.micro_batch_size} x {w.seq}, zero {w.zero}, recompute {w.recompute} (GiB)"))
    rp = res.peak_reserved_bytes
    for col in ("rank", "params", "grads", "optimizer", "fsdp", "held", "recv",
                "activations", "peak", *(("reserved",) if rp else ()), "at ms", "headroom"):
        t.add_column(col, justify="right", key=None if col in ("rank", "at ms") else
                     col + "_gib")
    for r, m in enumerate(res.memory):
        sb = res.derived.static[r]
        top = rp[r] if rp else m.peak          # the headroom of what runs out
        t.add_row(str(r), *(num_gib(x) for x in (
            sb.params, sb.grads, sb.optimizer, sb.unsharded, m.held, m.recv,
            m.peak_activations, res.peak_memory_bytes[r], *((rp[r],) if rp else ()))),
            num_time(m.peak_at),
            num_gib(res.hbm_bytes - top))
    console.print(t)
    console.print(workload_line(res), highlight=False)


def print_memory_gib(tl: Any, json_out: Path | None) -> bool:
    """``schedsim memory`` of a workload's timeline (True; False when ``tl`` has no byte
    model): per rank the static bytes, the peak activations, the peak and when, the
    caching allocator's reserved peak where the workload carries it
    (``peak_reserved_bytes``), the headroom against HBM of what runs out (reserved,
    else the peak) (GiB); ``json_out`` gets the bytes and the curves (``[ms, bytes of
    activations]`` points)."""
    from schedsim.analysis.memory import workload_memory

    mem = workload_memory(tl)
    if mem is None:
        return False
    hbm = float(tl.workload["hbm_bytes"])
    rp = tl.workload.get("peak_reserved_bytes")
    # with the allocator's replay, the allocated peaks of its stream (beside its reserved)
    peaks = tl.workload["peak_memory_bytes"] if rp else [m.peak for m in mem]
    if json_out is not None:
        from schedsim.util.files import atomic_write_text

        atomic_write_text(json_out, json.dumps({
            "unit": "bytes", "hbm_bytes": hbm,
            "ranks": [{"rank": r, "static": m.static, "held": m.held,
                       "peak_activations": m.peak_activations,
                       "peak": peaks[r], "peak_at_ms": m.peak_at,
                       **({"peak_reserved": rp[r]} if rp else {}),
                       "curve": [[float(t), float(v)] for t, v in zip(*m.curve)]}
                      for r, m in enumerate(mem)]}, indent=1) + "\n")
    t = DataTable("memory",
                  title=rich_escape(f"memory of {tl.schedule}: {tl.workload['model']} on "
                                    f"{tl.workload['gpu']} (GiB)"))
    for col in ("rank", "static", "held", "activations", "peak",
                *(("reserved",) if rp else ()), "at ms", "headroom"):
        t.add_column(col, justify="right", key=None if col in ("rank", "at ms") else
                     col + "_gib")
    for r, m in enumerate(mem):
        top = rp[r] if rp else m.peak
        t.add_row(str(r), *(num_gib(x) for x in (
            m.static, m.held, m.peak_activations, peaks[r], *((rp[r],) if rp else ()))),
            num_time(m.peak_at), num_gib(hbm - top))
    console.print(t)
    from schedsim.util.units import fmt_gib_pair

    worst = max(peaks)
    top = max(rp) if rp else worst
    verdict = "fits" if top <= hbm else "does NOT fit"
    top_text, hbm_text = fmt_gib_pair(top, hbm)
    reserved = f", {top_text} reserved (the caching allocator's)" if rp else ""
    console.print(f"static: parameters, gradients, optimizer states, FSDP copies and P2P "
                  f"receive buffers; held: what a stage keeps between its first and last "
                  f"op (torchtitan's FSDP copies, retained outputs) at the peak; "
                  f"activations per the recompute policy (Korthikanti et al. 2022); peak "
                  f"{fmt_gib(worst) if rp else top_text}{reserved} of {hbm_text} HBM: "
                  f"{verdict}",
                  highlight=False)
    return True


def workload_line(res: Any) -> str:
    """:meth:`WorkloadResult.line` with the step's parts."""
    return (f"{res.line()}; makespan {with_unit(res.makespan_ms, 'ms')} + step boundary "
            f"{with_unit(res.step_boundary_ms, 'ms')}")


def _peak(xs: list[float] | None, span: Any) -> Any:
    """A peak GiB cell: the text of ``span``, the highest rank's GiB exact."""
    return num(max(xs) / GIB if xs else None, span(xs))


def _print_breakdown(b: dict[str, Any]) -> None:
    t = DataTable("stages",
                  title=rich_escape(f"{b['model']} on {b['gpu']}: ms per microbatch on one "
                                    f"rank"))
    for col in ("stage", "rank", "layers", "F", "B", "W", "BW", "TFLOP", "act GiB",
                "stash GiB"):
        t.add_column(col, justify="right", key=col.lower() + "_ms" if len(col) < 3 else None)
    for s in b["stages"]:
        layers = str(s["layers"]) + ("+E" if s["embedding"] else "") + (
            "+L" if s["head"] else "")
        fl = sum(s["flops"][k] for k in ("F", "B", "W", "recompute"))
        a = s["activation_bytes"]
        t.add_row(str(s["stage"]), str(s["rank"]), layers,
                  *(num_time(s['ms'][k]) for k in ("F", "B", "W", "BW")),
                  num(fl / 1e12, f"{fl / 1e12:.2f}"),
                  num_gib(a['stored']),
                  num_gib(a['stash_w']))
    console.print(t)
    same: dict[str, list[int]] = {}     # each pieces line and the stages that have it
    for s in b["stages"]:
        same.setdefault("; ".join(f"{n} {fmt_time(v['F'])}/{fmt_time(v['B'])}/"
                                  f"{fmt_time(v['W'])}"
                                  for n, v in s["piece_ms_per_layer"].items()),
                        []).append(s["stage"])
    for line, stages in same.items():
        console.print(f"stage{'s' * (len(stages) > 1)} {number_runs(stages)} pieces, "
                      f"F/B/W ms (per layer): {rich_escape(line)}", highlight=False)
    rows = b["stages"][0]["activation_bytes"]["rows"]
    console.print(f"activations: Korthikanti et al. 2022 Table 2, {'; '.join(rows)}; P2P "
                  f"message {fmt_mib(b['message_bytes'])}; model FLOPs per step "
                  f"{b['model_flops_per_step']:.4g} (Megatron-LM's count); TFLOP: F + B + "
                  f"W + recompute", highlight=False)
    for r in b["ranks"]:
        static = r["params"] + r["grads"] + r["optimizer"] + r["fsdp_unsharded"]
        console.print(f"rank {r['rank']}: static {fmt_gib(static)} (params "
                      f"{gib_number(r['params'])}, grads {gib_number(r['grads'])}, optimizer "
                      f"{gib_number(r['optimizer'])}, fsdp {gib_number(r['fsdp_unsharded'])}), "
                      f"recv buffers {fmt_gib(r['recv_buffers'])}, step boundary "
                      f"{with_unit(r['step_boundary_ms'], 'ms')}", highlight=False)


@app.command()
@handle_errors(tables=True)
@scenario_command
def costs(
    sc: Scenario,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write the breakdown as JSON ('-': stdout).")] = None,
) -> None:
    """Print the derived costs of a scenario's \\[workload] per stage: layers, FLOPs, ms per
    op kind and per piece, activation bytes; per rank the static bytes and the step
    boundary.

    Examples:
      schedsim costs schedules/llama3-70b-h100.toml
      schedsim costs schedules/llama3-70b-h100.toml --gpu h200 --json costs.json
    """
    sc = with_workload(sc, model=model, gpu=gpu)
    if sc.workload_model() is None:
        raise ScenarioError("schedsim costs reads a [workload] table (model, gpu, seq, "
                            "global_batch_size, tp, pp, ...; docs/workload.md)")
    if json_out is not None and str(json_out) != "-":
        from schedsim.util.files import check_output_path

        check_output_path(json_out)
    from schedsim.workload.breakdown import costs_breakdown

    prog = sc.build_program()
    b = costs_breakdown(sc.derived_workload(prog.placement), prog.placement)
    if json_out is not None:
        write_text_out(json_out, json.dumps(b, indent=1) + "\n")
        if str(json_out) == "-":
            return
    _print_breakdown(b)


def _write_compare(rows: list[tuple[str, Any]], head: str, json_out: Path | None,
                   gantt: Path | None, memory: Any) -> None:
    """The outputs of :func:`compare_workload`, together or none: ``json_out`` (a record
    per schedule), ``gantt`` (a chart per schedule on one time axis, titled ``head``;
    ``memory``: a memory panel each)."""
    from schedsim.util.files import output_group

    with output_group() as outs:
        if json_out is not None:
            outs.path(json_out).write_text(json.dumps(
                [{"schedule": n, "stages": r.timeline.stages, **r.summary(),
                  "bubble_ratio": r.bubble_ratio} for n, r in rows], indent=1) + "\n")
        if gantt is not None:
            from schedsim.plot import gantt_stack, save_figure

            titles = [f"{n}: step {with_unit(r.step_ms, 'ms')}, bubble "
                      f"{fmt_bubble(r.bubble_ratio)}"
                      for n, r in rows]
            save_figure(gantt_stack([r.timeline for _, r in rows], titles=titles,
                                    suptitle=f"{head}, one time axis", memory=memory),
                        outs.path(gantt))


def compare_workload(sc: Scenario, names: str | None, json_out: Path | None,
                     gantt: Path | None = None, memory: Any = None,
                     shared: dict[str, Any] | None = None, source: str = "scenario",
                     quiet: bool = False) -> None:
    """``schedsim compare --scenario`` of a scenario with a ``[workload]``: every schedule
    (or ``names``, a ``--schedules`` list) run as ``simulate -s NAME`` runs it with the
    same flags (``shared``: the generator and comm-policy flags;
    :func:`schedsim.sweep_workload.compare_workload_schedules`), each with the stages per rank its
    generator builds (the ``[workload]``'s ``chunks`` for a generator that takes them);
    one row each: step ms, tokens/s/GPU, MFU, bubble, peak GiB per rank (and the
    reserved GiB where the workload's allocator is ``caching``); a schedule whose
    sizes or layers do not fit is skipped with the reason (none left: exit 2,
    :func:`schedsim.sweep.none_ran`). ``gantt``: one chart per schedule on one time axis
    (``memory``, a memory model: a memory panel each, in GiB). ``quiet``: one line per
    schedule (its step line, as ``simulate -q`` prints it, and its bubble ratio)."""
    from schedsim.sweep import none_ran
    from schedsim.sweep_workload import compare_workload_schedules

    rows, skipped = compare_workload_schedules(sc, names, shared, source=source)
    none_ran(len(rows), skipped, "on this [workload]")
    w = sc.workload_model()
    head = (f"{w.model.name} on {w.gpus} x {w.gpu.name}: tp {w.tp}, pp {w.pp}, dp "
            f"{w.data_parallel}, {w.microbatches} microbatches, {sc.comm.semantics} "
            f"semantics")
    _write_compare(rows, head, json_out, gantt, memory)
    t = DataTable("schedules", title=rich_escape(head))
    reserved = any(r.peak_reserved_bytes for _, r in rows)
    for col in ("schedule", "stages", "step ms", "tokens/s/GPU", "MFU", "bubble",
                "peak GiB", *(("reserved GiB",) if reserved else ()), "fits"):
        t.add_column(col, justify="left" if col == "schedule" else "right")

    def span(xs: list[float] | None) -> str:
        if not xs:
            return "-"
        lo, hi = gib_number(min(xs)), gib_number(max(xs))
        return f"{lo}..{hi}" if lo != hi else hi

    for n, r in rows:
        t.add_row(n, str(r.timeline.stages), num_time(r.step_ms),
                  num(r.tokens_per_s_per_gpu, fmt_rate(r.tokens_per_s_per_gpu)),
                  num(r.mfu, fmt_mfu(r.mfu)), num(r.bubble_ratio, fmt_bubble(r.bubble_ratio)),
                  _peak(r.peak_memory_bytes, span),
                  *((_peak(r.peak_reserved_bytes, span),) if reserved else ()),
                  "yes" if r.fits else "NO")
    from schedsim.cli.tables import data_format, rows_only

    if not quiet or data_format():          # -q --format csv|json: the rows alone
        with rows_only(quiet):
            console.print(t)
            for n, why in skipped.items():
                console.print(f"skipped {n}: {rich_escape(why)}", highlight=False,
                              soft_wrap=True)
    if quiet:
        for n, r in rows:
            console.print(f"{rich_escape(n)}: {r.line()}, bubble ratio "
                          f"{fmt_bubble(r.bubble_ratio)}", highlight=False, soft_wrap=True)
