"""Gantt charts of a Timeline (matplotlib; PNG, SVG or PDF by file extension).

Functions return a :class:`matplotlib.figure.Figure` built without pyplot, so nothing
global is touched and notebooks/scripts can compose them; :func:`save_figure` writes one
atomically.
"""
from __future__ import annotations

import colorsys
from pathlib import Path

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .timeline import Span, Timeline

#: base colour per kind (colour-blind-safe palette)
KIND_COLORS = {
    "F": "#4C72B0",   # blue
    "B": "#55A868",   # green
    "W": "#DD8452",   # orange
    "BW": "#8172B3",  # purple
}
KIND_NAMES = {"F": "F (forward)", "B": "B (input grad)", "W": "W (weight grad)",
              "BW": "BW (full backward)"}


def shade(color: str, chunk: int) -> tuple[float, float, float]:
    """Colour of ``kind`` for a chunk/direction: chunk 0 as is, later chunks lighter."""
    r, g, b = to_rgb(color)
    h, l_, s = colorsys.rgb_to_hls(r, g, b)
    l_ = min(0.92, l_ + 0.22 * chunk)
    return colorsys.hls_to_rgb(h, l_, s)


def _is_integral(tl: Timeline) -> bool:
    return all(float(s.start).is_integer() and float(s.end).is_integer() for s in tl.spans)


def _boxes(span: Span) -> list[tuple[str, int, int, float, float]]:
    """(kind, chunk, mb, y-offset fraction, height fraction) per drawn box of a span."""
    if span.parts:
        f, b = span.parts
        return [(f.kind, f.chunk, f.mb, 0.5, 0.5), (b.kind, b.chunk, b.mb, 0.0, 0.5)]
    return [(span.kind, span.chunk, span.mb, 0.0, 1.0)]


def default_title(tl: Timeline) -> str:
    """Schedule, ranks, microbatches, semantics, makespan and bubble ratio."""
    mk = f"{tl.makespan:g}" if tl.makespan == int(tl.makespan) else f"{tl.makespan:.4g}"
    sem = tl.semantics + ("" if tl.comm_stream == "none" else f", {tl.comm_stream} stream")
    return (f"{tl.schedule}: {tl.ranks} ranks, {tl.microbatches} microbatches, {sem} — "
            f"makespan {mk} {tl.unit}{'s' if tl.unit == 'slot' else ''}, bubble "
            f"{tl.bubble_ratio():.1%}")


def gantt(tl: Timeline, *, title: str | None = None, width: float | None = None,
          label_mb: bool = True) -> Figure:
    """Gantt chart: one row per rank (rank 0 on top), one box per compute span.

    Colour per kind; later chunks (DualPipe's second direction, interleaved or V chunks)
    drawn lighter; ``FB`` drawn as two halves (forward on top, backward below);
    microbatch numbers inside boxes wide enough to hold them; integer slot ticks
    ``T0, T1, ...`` when every time is a whole number, else a time axis in the
    timeline's unit. Returns the Figure (nothing is shown or saved).
    """
    n = tl.ranks
    span_t = max(tl.makespan, 1e-9)
    integral = _is_integral(tl)
    if width is None:
        width = min(28.0, max(8.0, 0.32 * span_t if integral else 14.0))
    height = min(24.0, 1.2 + 0.42 * n)
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    fontsize = max(5.0, min(9.0, 220.0 / max(n, 1), 900.0 / max(span_t, 1)))
    px_per_unit = width * fig.dpi * 0.9 / span_t
    kinds_seen: set[str] = set()
    chunks_seen: set[int] = set()
    for s in tl.spans:
        y0 = n - 1 - s.rank
        for kind, chunk, mb, off, h in _boxes(s):
            kinds_seen.add(kind)
            chunks_seen.add(chunk)
            ax.add_patch(Rectangle((s.start, y0 + 0.06 + off * 0.88), s.end - s.start,
                                   h * 0.88, facecolor=shade(KIND_COLORS[kind], chunk),
                                   edgecolor="white", linewidth=0.5))
            wide = (s.end - s.start) * px_per_unit >= fontsize * (1.3 + 0.6 * len(str(mb)))
            if label_mb and wide and h * 0.88 * (height * fig.dpi / (n + 1)) > fontsize:
                lum = sum(shade(KIND_COLORS[kind], chunk)) / 3
                ax.text((s.start + s.end) / 2, y0 + 0.06 + (off + h / 2) * 0.88, str(mb),
                        ha="center", va="center", fontsize=fontsize,
                        color="black" if lum > 0.6 else "white")
    ax.set_xlim(0, span_t)
    ax.set_ylim(0, n)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)],
                  fontsize=max(5.0, min(9.0, 260.0 / n)))
    if integral and span_t <= 400:
        step = max(1, int(round(span_t / 40)))
        ticks = list(range(0, int(span_t) + 1, step))
        ax.set_xticks([t + 0.5 for t in ticks if t < span_t],
                      [f"T{t}" for t in ticks if t < span_t], fontsize=7)
        ax.set_xticks(range(0, int(span_t) + 1), minor=True)
        ax.grid(axis="x", which="minor", color="#dddddd", linewidth=0.4)
        ax.tick_params(axis="x", which="minor", length=0)
        ax.set_xlabel("time slot")
    else:
        ax.set_xlabel(f"time ({tl.unit})")
    ax.set_axisbelow(True)
    ax.set_facecolor("#f7f7f7")   # idle time shows as grey background
    handles = [Patch(facecolor=KIND_COLORS[k], label=KIND_NAMES[k])
               for k in ("F", "B", "W", "BW") if k in kinds_seen]
    if any(s.parts for s in tl.spans):
        handles.append(Patch(facecolor="white", edgecolor="grey",
                             label="FB: F (top) + B (bottom)"))
    if len(chunks_seen) > 1:
        word = "direction" if tl.placement == "dual" else "chunk"
        for c in sorted(chunks_seen):
            handles.append(Patch(facecolor=shade("#777777", c), label=f"{word} {c}"))
    handles.append(Patch(facecolor="#f7f7f7", edgecolor="#cccccc", label="idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 if n < 6
              else -0.06), ncol=min(len(handles), 8), fontsize=8, frameon=False)
    ax.set_title(title or default_title(tl), fontsize=10)
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Save ``fig`` (format from the extension: .png, .svg, .pdf) atomically."""
    from .io import atomic_path

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        from .errors import ScenarioError

        raise ScenarioError(f"{path}: unsupported figure format (use .png, .svg or .pdf)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix[1:].lower())
