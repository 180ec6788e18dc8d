"""Throughput against peak memory: the Pareto front of a plan's simulated candidates and
its figure (matplotlib, no pyplot; PNG, SVG or PDF by the file's suffix).

A row is on the front when no other row that ran has at least its throughput with at
most its peak memory, one of them strictly better.
"""
from __future__ import annotations

from typing import Any, Sequence

from schedsim.plan.rows import GIB, PlanRow
from schedsim.util.units import fmt_gib


def pareto_front(rows: Sequence[PlanRow]) -> list[PlanRow]:
    """The rows (status ``ok``) no other row dominates (module docstring), by ascending
    peak memory (then name); throughput rises along it."""
    ok = sorted((r for r in rows if r.status == "ok"),
                key=lambda r: (r.peak_max_gib, -r.tokens_per_s_per_gpu, r.key))
    front: list[PlanRow] = []
    best = -1.0
    for r in ok:
        if r.tokens_per_s_per_gpu > best:
            front.append(r)
            best = r.tokens_per_s_per_gpu
    return front


def _short(r: PlanRow) -> str:
    return r.name           # (schedsim.plan.names: the name every human output uses)


def pareto_figure(rows: Sequence[PlanRow], *, mem_limit_gib: float | None = None,
                  title: str = "") -> Any:
    """The figure: every simulated row as a point (peak GiB on the busiest rank against
    tokens/s/GPU, one colour per schedule; hollow when it does not fit), the front as a
    step line with its points named, the best that fits as a star, the memory limit as a
    dashed line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6.2), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    ok = [r for r in rows if r.status == "ok"]
    names = sorted({r.candidate.schedule for r in ok})
    colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
    for n in names:
        mine = [r for r in ok if r.candidate.schedule == n]
        fit = [r for r in mine if r.fits]
        over = [r for r in mine if not r.fits]
        if fit:
            ax.scatter([r.peak_max_gib for r in fit], [r.tokens_per_s_per_gpu for r in fit],
                       s=22, color=colors[n], label=n, alpha=0.8, zorder=3)
        if over:
            ax.scatter([r.peak_max_gib for r in over],
                       [r.tokens_per_s_per_gpu for r in over], s=22, facecolors="none",
                       edgecolors=colors[n], label=None if fit else f"{n} (does not fit)",
                       alpha=0.8, zorder=3)
    fitting = [r for r in ok if r.fits]
    best = min(fitting, key=PlanRow.rank_key) if fitting else None
    front = pareto_front(ok)
    if front:
        xs = [r.peak_max_gib for r in front]
        ys = [r.tokens_per_s_per_gpu for r in front]
        ax.step(xs, ys, where="post", color="0.3", lw=1.2, zorder=2, label="Pareto front")
        named = [r for r in front if r is not best][-6:]    # the best: in the legend
        for j, r in enumerate(named):      # alternate below / above: no overlap
            ax.annotate(_short(r), (r.peak_max_gib, r.tokens_per_s_per_gpu),
                        textcoords="offset points", xytext=(6, -11 if j % 2 else 5),
                        fontsize=7, color="0.2")
    if best is not None:
        b = best
        ax.scatter([b.peak_max_gib], [b.tokens_per_s_per_gpu], marker="*", s=220,
                   color="gold", edgecolors="black", linewidths=0.8, zorder=4,
                   label=f"best: {_short(b)}")
    if mem_limit_gib is not None:
        ax.axvline(mem_limit_gib, color="tab:red", ls="--", lw=1,
                   label=f"memory limit {fmt_gib(mem_limit_gib * GIB)}")
    ax.set_xlabel("peak memory on the busiest rank (GiB)")
    ax.set_ylabel("tokens / s / GPU")
    ax.set_title(title or "plan: throughput against peak memory", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.08, y=0.12)
    if ok:
        ax.legend(fontsize=8, loc="best")
    return fig
