"""Regenerate the pictures under docs/img (run from the project root):

    python docs/make_figures.py              # writes docs/img
    python docs/make_figures.py --out figs   # writes elsewhere (the docs test does this)

Every picture is drawn by schedsim's public plotting API from a simulated timeline, or
from the measured timelines committed under docs/img/replay. With Debian's chromium
installed it also takes the screenshot of the HTML report (docs/img/report.png).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from schedsim import CommModel, CostModel, LinkModel, build_program, load_scenario, simulate
from schedsim.plot import gantt, gantt_stack, memory_plot, overlay, save_figure
from schedsim.plot.overlay import write_overlay
from schedsim.timeline import Timeline

ROOT = Path(__file__).resolve().parents[1]


def scenario_timeline(path: Path, semantics: str | None = None):
    sc = load_scenario(path)
    comm = sc.comm if semantics is None else sc.comm.model_copy(
        update={"semantics": semantics})
    return simulate(sc.build_program(), sc.costs, sc.link, comm)


def detail_timeline(path: Path) -> Timeline:
    """The run of a scenario with a ``[model]``, with the pieces of every op attached
    (what ``simulate --detail`` draws)."""
    from schedsim.sim.pieces import attach_pieces

    sc = load_scenario(path)
    tl = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    attach_pieces(tl, sc.stage_costs())
    return tl


def report_screenshot(out: Path) -> None:
    """The HTML report of the DualPipe figure under rendezvous, as Chromium shows it."""
    exe = shutil.which("chromium")
    if exe is None:
        print("chromium not installed: report.png not regenerated")
        return
    from schedsim.analysis.stalls import attribute_stalls
    from schedsim.report.html import report_html

    sc = load_scenario(ROOT / "schedules" / "dualpipe-figure.toml")
    prog = sc.build_program()
    tl = simulate(prog, sc.costs, sc.link, sc.comm.model_copy(update={"semantics":
                                                                      "rendezvous"}))
    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "report.html"
        page.write_text(report_html(tl, stalls=attribute_stalls(tl, prog)))
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        "--virtual-time-budget=20000", "--window-size=1400,1000",
                        f"--screenshot={out / 'report.png'}", page.as_uri()],
                       capture_output=True, timeout=120, check=True)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    figure = ROOT / "schedules" / "dualpipe-figure.toml"
    data = scenario_timeline(figure)
    rdv = scenario_timeline(figure, "rendezvous")
    # 1. the DualPipe README figure, and the same with the T10 -> T12 messages highlighted
    save_figure(gantt(data), out / "dualpipe.png")
    save_figure(gantt(data, highlight=[("B", 5, 4, 0), ("B", 2, 3, 10)]),
                out / "dualpipe-arrows.png")
    # 2. 1F1B vs ZB-H1 vs ZB-V vs DualPipeV, 8 ranks, 16 microbatches, the same model:
    #    one stage per rank costs F=B=W=2; a V-shape chunk (half a rank's layers) F=B=W=1
    whole = CostModel(F=2, B=2, W=2)
    half = CostModel(F=1, B=1, W=1)
    link, comm = LinkModel(), CommModel()
    tls = [simulate(build_program("1f1b", 8, 16), whole, link, comm),
           simulate(build_program("zb-h1", 8, 16), whole, link, comm),
           simulate(build_program("zbv", 8, 16), half, link, comm),
           simulate(build_program("dualpipev", 8, 16), half, link, comm)]
    save_figure(gantt_stack(tls, suptitle="8 ranks, 16 microbatches, one model: a rank's "
                            "layers cost F=B=W=2 slots (a V-shape chunk, half of them: 1 slot); "
                            "data semantics, free comm"), out / "compare-8ranks.png")
    # 3. activation memory of the same four runs
    save_figure(memory_plot(tls), out / "memory.png")
    # 4. a 32-rank interleaved schedule (2 chunks per rank, 64 microbatches): scaled
    il = simulate(build_program("interleaved-1f1b", 32, 64, chunks=2),
                  CostModel(F=1, BW=2), link, comm)
    save_figure(gantt(il, memory=True), out / "interleaved-32.png")
    # 5. 8 ranks, 16 microbatches, 2 chunks: too long for one band, wrapped into two
    il8 = simulate(build_program("interleaved-1f1b", 8, 16, chunks=2),
                   CostModel(F=1, BW=2), link, CommModel(semantics="rendezvous"))
    save_figure(gantt(il8, arrows=True), out / "interleaved-8-bands.png")
    # 6. 64 ranks: labels every rank, memory as min-max band plus selected ranks
    zb64 = simulate(build_program("zb-h1", 64, 128), CostModel(F=1, B=1, W=1), link, comm)
    save_figure(gantt(zb64, memory=True), out / "zb-h1-64.png")
    # 7. the DualPipe scenario under data vs rendezvous semantics, and its memory panel
    save_figure(overlay(data, rdv), out / "overlay-dualpipe.png")
    save_figure(gantt(rdv, stalls=True, memory=True, arrows=True),
                out / "dualpipe-rendezvous.png")
    # 8. the MoE stage model on a 4-rank DualPipe, each op's compute and collective
    #    pieces (docs/stage-model.md; as `simulate dualpipe-moe-small.toml --gantt F
    #    --detail` draws it)
    save_figure(gantt(detail_timeline(ROOT / "schedules" / "dualpipe-moe-small.toml"),
                      detail=True), out / "stage-model-detail.png")
    # 8b. 1F1B-overlap with one hardware queue (connections = 1): the forward's dispatch
    #     of every pair waits behind the queue (docs/stage-model.md)
    save_figure(gantt(detail_timeline(ROOT / "schedules" / "1f1b-overlap-queue.toml"),
                      detail=True), out / "one-queue-detail.png")
    # 9. the measured replays committed under docs/img/replay (timelines, not re-run)
    rep = ROOT / "docs" / "img" / "replay"
    for name in ("1f1b", "dualpipev"):
        meas = rep / f"{name}-measured.json"
        if meas.exists():
            (out / "replay").mkdir(exist_ok=True)
            m = Timeline.read_json(meas)
            save_figure(gantt(m), out / "replay" / f"{name}-measured.png")
            pred = rep / f"{name}-predicted.json"
            if pred.exists():
                write_overlay(Timeline.read_json(pred), m,
                              out / "replay" / f"{name}-overlay.png")
    # 10. the Pareto plot of docs/plan.md's plan (Llama 3.1 8B on 16 H100)
    from schedsim.plan import PlanSpace
    from schedsim.plan.driver import run_plan
    from schedsim.plan.pareto import pareto_figure

    res = run_plan(PlanSpace(model="llama3.1-8b", gpus=16, gpu="h100-sxm", seq=4096,
                             global_batch_size=64, tp=[1, 2, 4], pp=[1, 2, 3, 4],
                             schedules=["1f1b", "interleaved-1f1b", "zbv", "dualpipev"],
                             recompute=["none", "full"]), top=3)
    save_figure(pareto_figure(res.rows, mem_limit_gib=res.resolved.mem_limit_bytes / 2**30,
                              title="llama3.1-8b on 16 x h100-sxm, seq 4096, global batch "
                                    "64"), out / "plan-pareto.png")
    report_screenshot(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img",
                    help="folder to write the pictures to (default: docs/img)")
    main(ap.parse_args().out)
