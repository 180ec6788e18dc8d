"""Costs from measurements, on the command line: ``calibrate --from-timeline`` (a measured
Timeline, :mod:`schedsim.replay.fit`), ``calibrate --from-trace`` and ``import-trace`` of a
stage-internal piece trace (:mod:`schedsim.interop.kineto_pieces`,
:mod:`schedsim.interop.piece_model`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


from schedsim.cli.tables import DataTable
from schedsim.cli.common import console, fail, write_text_out
from schedsim.cli.outputs import check_outputs
from schedsim.errors import ScenarioError
from schedsim.util.units import fmt_time, with_unit


def print_pieces(pt: Any) -> None:
    """The per-piece GPU times of a piece trace (mean, range over layers, streams) and,
    when the blocks fit the stage model, its prediction of the overlapped pair."""
    from schedsim.errors import ScenarioError
    from schedsim.interop.kineto_pieces import piece_costs
    from schedsim.interop.piece_model import predict_pair

    t = DataTable("pieces",
                  title=f"pieces of {pt.path.name} (GPU time of their kernels, ms; streams "
                        f"kept apart)")
    for col in ("piece", "layers", "mean", "min", "max", "streams: kernels, busy ms (all layers)"):
        t.add_column(col, justify="left" if col.startswith(("piece", "streams")) else "right")
    per_stream: dict[str, dict[Any, list[float]]] = {}
    for p in pt.pieces:
        d = per_stream.setdefault(p.name, {})
        for s, use in p.streams.items():
            d.setdefault(s, [0, 0.0])
            d[s][0] += use.kernels
            d[s][1] += use.busy / 1e3
    for name, c in piece_costs(pt).items():
        streams = ", ".join(f"{s}: {k}, {fmt_time(b)}" for s, (k, b) in
                            sorted(per_stream[name].items(), key=lambda x: str(x[0])))
        t.add_row(name + (" [collective]" if c["is_comm"] else ""), str(c["layers"]),
                  fmt_time(c['mean']), fmt_time(c['min']), fmt_time(c['max']), streams)
    console.print(t)
    try:
        pred = predict_pair(pt)
    except ScenarioError as e:
        console.print(f"stage model: {e}", highlight=False, soft_wrap=True, markup=False)
        return
    timed = [p for p in pt.pieces if p.intervals]
    span = (max(p.end for p in timed) - min(p.start for p in timed)) / 1e3 / pred.layers
    console.print(f"stage model (overlap fb): the F&B pair {with_unit(pred.overlapped, 'ms')} "
                  f"per layer (measured span {with_unit(span, 'ms')} per layer: error "
                  f"{100 * (pred.overlapped - span) / span:+.1f}%); nothing overlapped "
                  f"{with_unit(pred.sequential, 'ms')} (compute {fmt_time(pred.compute)}, "
                  f"collectives {fmt_time(pred.collective)})", highlight=False, soft_wrap=True)


def calibrate_from_trace(path: Path, out: Path | None) -> None:
    """``calibrate --from-trace``: the piece trace's per-layer costs as a ``[model]``
    table (:func:`~schedsim.interop.piece_model.model_table`)."""
    from schedsim.interop.kineto import read_piece_trace
    from schedsim.interop.piece_model import model_table

    check_outputs(out)
    pt = read_piece_trace(path)
    text = model_table(pt)
    if out is not None:
        print_pieces(pt)
    write_text_out(out, text)


def calibrate_timeline(ti: Any, out: Path | None, exact: bool) -> None:
    """``calibrate --from-timeline``: fit and write the cost file
    (:func:`schedsim.replay.fit.fit_timeline`)."""
    from schedsim.replay.fit import fit_timeline

    tl = ti.timeline
    if tl.source != "measured":
        fail(f"{ti.path}: a {tl.source} timeline: --from-timeline fits a measured run (a "
             f"replay's or an imported trace's)")
    check_outputs(out)
    fit = fit_timeline(tl, ti.program, exact=exact)
    if out is not None:
        t = DataTable("fitted_costs",
                      title=f"fitted costs ({tl.unit}, median over microbatches) of "
                            f"{tl.schedule}")
        kinds = [k for k in ("F", "B", "W", "BW", "FB")
                 if any(k in c for c in fit.stages.values())]
        for col in ("stage", *kinds):
            t.add_column(col, justify="right")
        for st in sorted(fit.stages):
            t.add_row(str(st), *(fmt_time(fit.stages[st][k]) if k in fit.stages[st] else "-"
                                 for k in kinds))
        console.print(t)
        lat, bw = fit.link()
        console.print(f"link: latency {with_unit(lat, tl.unit)} from {len(fit.samples)} messages, "
                      f"bandwidth {'inf' if bw == float('inf') else f'{bw:.4g}'}; launch "
                      f"cost {with_unit(fit.launch_cost(), tl.unit)} (mean of {len(fit.launches)})"
                      + (f"; exact: {len(fit.overrides)} ops, {len(fit.transfers)} messages, "
                         f"{len(fit.host)} host times" if exact else ""), highlight=False,
                      soft_wrap=True)
    write_text_out(out, fit.to_toml(tl.schedule))


def contended_default(spec: Any, contended: bool | None, isolated: bool) -> bool:
    """Whether to calibrate contended (``--contended``): as asked, else on CPU gloo
    (where ranks share cores with their messages) unless ``--isolated`` is given."""
    if contended and isolated:
        fail("--contended runs the ranks together; --isolated takes turns: give one")
    if contended is not None:
        return contended
    cfg = spec.config
    return not isolated and cfg.backend == "gloo" and cfg.device_type == "cpu"


def warn_contention(procs: int) -> None:
    """One warning line when the run's processes outnumber the CPUs or the machine is
    loaded (load average above the CPUs left for the run): measured times then include
    waiting for a CPU (:func:`schedsim.replay.launch.contention`)."""
    from schedsim.replay.launch import contention

    why = contention(procs)
    if why:
        console.print(f"warning: {why}", highlight=False, soft_wrap=True, markup=False)


def calibrate_run(sc: Any, out: Path | None, *, nproc: int | None, backend: str | None,
                  timeout: float | None, repeats: int | None, isolated: bool,
                  contended: bool | None, spread: float | None = None) -> None:
    """``schedsim calibrate SCENARIO``: run the calibration on the real ranks (contended
    steps of the program, spread over ``spread`` s, or the benchmarks) and write the
    cost file. Defaults: :data:`~schedsim.replay.contended.SPREAD_REPEATS` steps over
    :data:`~schedsim.replay.contended.SPREAD_S` s contended, 5 rounds of benchmarks."""
    from schedsim.cli.common import Phases
    from schedsim.program.ir import Program
    from schedsim.replay.config import spec_from_scenario
    from schedsim.replay.contended import SPREAD_REPEATS, SPREAD_S, pause_for
    from schedsim.replay.contended import calibrated_model
    from schedsim.replay.launch import launch

    check_outputs(out)
    spec = spec_from_scenario(sc, backend=backend, timeout=timeout, calibrate=True,
                              replay=False, calib_isolated=isolated)
    spec.calib_contended = contended_default(spec, contended, isolated)
    if spread is not None and not spec.calib_contended:
        fail("--spread spreads the contended calibration's steps: it goes with --contended")
    if spec.calib_contended:
        repeats = repeats or SPREAD_REPEATS
        spread = SPREAD_S if spread is None else spread
        spec.calib_pause = pause_for(spread, repeats)
    repeats = repeats or 5
    spec.calib_repeats = repeats
    with Phases() as ph:
        n = check_nproc(spec, nproc)
        warn_contention(n)
        ph.step(f"calibrating on {n} ranks"
                + (f" ({repeats} contended steps of the program"
                   + (f", spread over {with_unit(spread, 's')})" if spread else ")")
                   if spec.calib_contended else ""))
        res = launch(spec, n)
    name = spec.program.get("name", "")
    costs, link, comm, text, spread = calibrated_model(
        res["calibration"], Program.model_validate(spec.program), "rendezvous", name)
    if out is not None:
        how = ("contended: steps of the program" if spec.calib_contended else
               "one rank at a time" if isolated else "benchmarks, ranks together")
        t = DataTable("calibrated_costs",
                      title=f"calibrated costs (ms, medians of {repeats}; {how}) on "
                            f"{res['calibration'].get('backend', '?')}, {n} ranks")
        for col in ("stage", "F", "B", "W", "BW", "FB"):
            t.add_column(col, justify="right")
        for s in sorted(costs.stage):
            c = costs.stage[s]
            t.add_row(str(s), *("-" if getattr(c, k) is None else fmt_time(getattr(c, k))
                                for k in ("F", "B", "W", "BW", "FB")))
        console.print(t)
        bw = link.bandwidth
        console.print(f"link: latency {with_unit(link.latency, 'ms')}, bandwidth "
                      f"{'inf' if bw == float('inf') else f'{bw:.4g} bytes/ms'}; launch "
                      f"cost {with_unit(comm.launch_cost, 'ms')} per batch; host cost "
                      f"{with_unit(comm.host_cost, 'ms')} per instruction", highlight=False,
                      soft_wrap=True)
        for line in spread:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    write_text_out(out, text)


def check_nproc(spec: Any, nproc: int | None) -> int:
    """The run's process count (ranks x tp); ``ScenarioError`` when ``--nproc`` differs
    and, under nccl, on a machine with fewer CUDA GPUs (exit 2, no rank started)."""
    ranks, tp = spec.program["placement"]["ranks"], spec.config.tp
    p = ranks * tp          # one process per rank and TP rank
    if nproc is not None and nproc != p:
        what = (f"{ranks} ranks (one process per rank)" if tp == 1 else
                f"{ranks} ranks x tp {tp} = {p} processes")
        raise ScenarioError(f"--nproc {nproc} does not match the program's {what}: use "
                            f"--nproc {p}")
    if spec.config.backend == "nccl":
        from schedsim.replay.config import require_gpus

        require_gpus(p)
    return p
