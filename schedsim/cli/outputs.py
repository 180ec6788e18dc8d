"""Output paths of the commands that write several files: checked before any work
(a typo fails at once), folders made on demand (and removed again on failure), and the
small writers ``replay --compare`` and ``check-trace`` share."""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from schedsim.errors import ScenarioError


def check_outputs(*files: Path | None, figures: tuple[Path | None, ...] = ()) -> None:
    """Check output files (and figure formats) before any work: a typo fails at once."""
    from schedsim.cli.options import check_figure_path
    from schedsim.util.files import check_output_path

    for f in figures:
        if f is not None:
            check_figure_path(f)
    for f in (*files, *figures):
        if f is not None and str(f) != "-":
            check_output_path(f)


def out_dir_files(out_dir: Path, name: str, kinds: "list[str] | tuple[str, ...]"
                  ) -> list[Path]:
    """The files ``--out-dir`` receives: ``out_dir/NAME-KIND`` for each kind
    (``measured.json``, ...), with ``NAME`` (a schedule's ``name``, ``--name``) made one
    plain file name (:func:`schedsim.util.files.safe_file_name`: ``../../x`` or an
    absolute name never leaves ``out_dir``). Each is claimed as an output of
    ``--out-dir`` in the command's I/O session, so ``--json od/NAME-errors.json
    --out-dir od`` is refused (two flags writing one file) before any work."""
    from schedsim.util.files import claim_output, safe_file_name

    stem = safe_file_name(name)
    files = [out_dir / f"{stem}-{k}" for k in kinds]
    for f in files:
        claim_output(f, "--out-dir")
    return files


def check_outputs_in(out_dir: Path | None, *files: Path | None) -> None:
    """:func:`check_outputs` for files of other flags (``--json``) that may lie inside an
    ``--out-dir`` the command creates: a file whose folder is ``out_dir`` (or below it)
    and does not exist yet is checked when the folder is made, not refused now as in a
    missing folder."""
    def later(f: Path) -> bool:
        if out_dir is None or f.parent.exists():
            return False
        top, parent = os.path.abspath(out_dir), os.path.abspath(f.parent)
        return parent == top or parent.startswith(top + os.sep)
    check_outputs(*(f for f in files if f is not None and not later(f)))


def check_folder(path: Path, flag: str) -> None:
    """Raise :class:`ScenarioError` unless ``path`` is a folder or can be made one: its
    nearest existing ancestor is a writable folder (a file in the way is named)."""
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        where = "is a file" if p == path else f"cannot be created: {p} is a file"
        raise ScenarioError(f"{flag} {path}: {where}; give a folder (created if missing)")
    if p == path:       # it exists: its files are checked one by one
        return
    try:        # os.access says yes to root, and to /proc: try making the folder
        os.rmdir(tempfile.mkdtemp(prefix=".schedsim-", dir=p))
    except OSError as e:
        raise ScenarioError(f"{flag} {path}: cannot create a folder in {p} "
                            f"({e.strerror})") from None


@contextmanager
def folder(path: Path) -> Iterator[Path]:
    """Create ``path`` (and missing parents) for the outputs written in the block; on an
    exception remove the folders created here again (empty if the block's outputs go
    through an :func:`~schedsim.util.files.output_group` opened inside it)."""
    created = []
    p = path
    while not p.exists() and p.parent != p:
        created.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for d in created:           # deepest first
            try:
                d.rmdir()
            except OSError:
                break
        raise


def write_errors(path: Path, errors: Any, outs: Any) -> None:
    """Write the errors JSON through the output group ``outs``."""
    outs.path(path).write_text(json.dumps(errors.to_dict(), indent=1) + "\n")


def program_text(prog: Any) -> str:
    """A program's text with a header saying how to simulate it."""
    pl = prog.placement
    return (f"# program of {prog.name}: {pl.ranks} ranks, {pl.stages} stages ({pl.kind} "
            f"placement), {prog.microbatches} microbatches\n# simulate: schedsim simulate "
            f"--program FILE --placement {pl.kind} --stages {pl.stages} --microbatches "
            f"{prog.microbatches} --semantics rendezvous\n" + prog.to_text())
