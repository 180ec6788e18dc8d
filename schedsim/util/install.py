"""Install hints that are right for how schedsim was installed."""
from __future__ import annotations

from pathlib import Path


def source_root() -> Path | None:
    """The checkout schedsim runs from (the folder holding its ``pyproject.toml``), or
    None when it is installed as a package (a wheel in site-packages)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "schedsim").is_dir() \
        else None


def install_hint(extra: str, package: str) -> str:
    """How to install the optional ``extra`` (which brings ``package``): ``pip install -e
    '.[extra]'`` in a source checkout (the path when it is not the current folder),
    ``pip install 'schedsim[extra]'`` otherwise; ``pip install package`` works either
    way."""
    root = source_root()
    if root is None:
        first = f"pip install 'schedsim[{extra}]'"
    else:
        here = root == Path.cwd().resolve()
        first = f"pip install -e '{'.' if here else root}[{extra}]'"
    return f"{first} (or pip install {package})"
