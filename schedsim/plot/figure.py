"""Writing figures to files."""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

FORMATS = (".png", ".svg", ".pdf")


def save_figure(fig: Figure, path: str | Path) -> None:
    """Save ``fig`` (format from the extension: .png, .svg, .pdf) atomically.

    Raises :class:`~schedsim.errors.ScenarioError` for another extension (nothing is
    written).
    """
    from schedsim.errors import ScenarioError
    from schedsim.util.files import atomic_path
    from schedsim.util.text import literal_text

    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ScenarioError(f"{path}: unsupported figure format {path.suffix!r} (use .png, "
                            ".svg or .pdf)")
    with atomic_path(path) as tmp:
        literal_text(fig).savefig(tmp, format=path.suffix[1:].lower())
