"""Regenerate the pictures under docs/img (run from the project root):

    python docs/make_figures.py

Every picture is drawn by schedsim's public plotting API from a simulated timeline.
"""
from __future__ import annotations

from pathlib import Path

from schedsim import CommModel, CostModel, LinkModel, build_program, load_scenario, simulate
from schedsim.plot import compare, gantt, memory_plot, overlay, save_figure

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"


def scenario_timeline(path: Path, semantics: str | None = None):
    sc = load_scenario(path)
    comm = sc.comm if semantics is None else sc.comm.model_copy(
        update={"semantics": semantics})
    return simulate(sc.build_program(), sc.costs, sc.link, comm)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    figure = ROOT / "schedules" / "dualpipe-figure.toml"
    data = scenario_timeline(figure)
    rdv = scenario_timeline(figure, "rendezvous")
    # 1. the DualPipe README figure, and the same with the T10 -> T12 messages highlighted
    save_figure(gantt(data), OUT / "dualpipe.png")
    save_figure(gantt(data, highlight=[("B", 5, 4, 0), ("B", 2, 3, 10)]),
                OUT / "dualpipe-arrows.png")
    # 2. 1F1B vs ZB-H1 vs ZB-V vs DualPipeV, 8 ranks, 16 microbatches, the same model:
    #    one stage per rank costs F=B=W=2; a V-shape chunk (half a rank's layers) F=B=W=1
    whole = CostModel(F=2, B=2, W=2)
    half = CostModel(F=1, B=1, W=1)
    link, comm = LinkModel(), CommModel()
    tls = [simulate(build_program("1f1b", 8, 16), whole, link, comm),
           simulate(build_program("zb-h1", 8, 16), whole, link, comm),
           simulate(build_program("zbv", 8, 16), half, link, comm),
           simulate(build_program("dualpipev", 8, 16), half, link, comm)]
    save_figure(compare(tls, suptitle="8 ranks, 16 microbatches, one model: a rank's "
                        "layers cost F=B=W=2 slots (a V-shape chunk, half of them: 1 slot); "
                        "data semantics, free comm"), OUT / "compare-8ranks.png")
    # 3. activation memory of the same four runs
    save_figure(memory_plot(tls), OUT / "memory.png")
    # 4. a 32-rank interleaved schedule (2 chunks per rank, 64 microbatches)
    il = simulate(build_program("interleaved-1f1b", 32, 64, chunks=2),
                  CostModel(F=1, BW=2), link, comm)
    save_figure(gantt(il), OUT / "interleaved-32.png")
    # 5. the DualPipe scenario under data vs rendezvous semantics, and its memory panel
    save_figure(overlay(data, rdv), OUT / "overlay-dualpipe.png")
    save_figure(gantt(rdv, stalls=True, memory=True), OUT / "dualpipe-rendezvous.png")


if __name__ == "__main__":
    main()
