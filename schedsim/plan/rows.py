"""One simulated candidate's figures (:class:`PlanRow`), the ranking order, and the
``--out`` stream: rows appended to a JSON-lines or CSV file as they finish, read back by
``--resume``.

The stream is written in place on purpose (not through a temporary file): an
interrupted sweep keeps every row that finished. Each row is one line, written whole
and flushed; a last line cut short by a kill is dropped when the file is resumed. Every
row carries the sweep's identity (model, GPUs, sequence, batch, comm settings), so
``--resume`` refuses a file written by another sweep. Floats are written with
``repr`` (JSON) or ``repr`` in CSV, so a resumed row has exactly the figures it had.
An ``--out`` of ``-`` streams the JSON lines to stdout (nothing to resume from).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.plan.space import Candidate
from schedsim.util.units import GIB as _GIB

#: bytes in a GiB, as a float (:data:`schedsim.util.units.GIB`)
GIB = float(_GIB)
#: suffixes ``--out`` writes
OUT_FORMATS = {".jsonl": "JSON lines", ".csv": "CSV"}


@dataclass
class PlanRow:
    """A simulated candidate. ``status``: ``ok``, or ``error`` (the simulation failed:
    ``message`` says why). Times in ms; ``peak_gib``: peak memory per pipeline rank
    (GiB); ``fits``: every rank's peak within the memory limit."""

    candidate: Candidate
    stages: int = 0
    microbatches: int = 0
    status: str = "ok"
    fits: bool = False
    step_ms: float = 0.0
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0
    bubble_ratio: float = 0.0
    peak_gib: list[float] = field(default_factory=list)
    message: str = ""

    @property
    def key(self) -> str:
        return self.candidate.key

    @property
    def name(self) -> str:
        """The name for people (:func:`schedsim.plan.names.candidate_name`)."""
        from schedsim.plan.names import candidate_name

        return candidate_name(self.candidate, self.stages)

    @property
    def peak_max_gib(self) -> float:
        return max(self.peak_gib) if self.peak_gib else 0.0

    def rank_key(self) -> tuple:
        """Sort key of the ranking: throughput (highest first), then the lower peak,
        then the candidate's name: a total order, the same on every executor."""
        return (-self.tokens_per_s_per_gpu, self.peak_max_gib, self.key)

    def to_dict(self) -> dict[str, Any]:
        d = {"key": self.key, "name": self.name, **self.candidate.to_dict()}
        d.update({f.name: getattr(self, f.name) for f in fields(self)
                  if f.name != "candidate"})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PlanRow":
        names = {f.name for f in fields(cls)} - {"candidate"}
        return cls(candidate=Candidate.from_dict(d),
                   **{k: d[k] for k in names if k in d})


def rank(rows: list[PlanRow]) -> list[PlanRow]:
    """The rows that ran and fit, best first (:meth:`PlanRow.rank_key`)."""
    return sorted((r for r in rows if r.status == "ok" and r.fits), key=PlanRow.rank_key)


# -- the --out stream ------------------------------------------------------------------

def check_out(path: Path) -> None:
    """Refuse an ``--out`` whose suffix is not :data:`OUT_FORMATS` or that cannot be
    written. Raises :class:`ScenarioError`."""
    from schedsim.util.files import check_output_path

    if str(path) == "-":            # JSON lines on stdout
        return
    if path.suffix.lower() not in OUT_FORMATS:
        raise ScenarioError(f"{path}: --out writes "
                            + " or ".join(f"{k} ({v})" for k, v in OUT_FORMATS.items())
                            + f", not {path.suffix or 'a file without suffix'!r}")
    check_output_path(path)


def _csv_columns() -> list[str]:
    cand = [f.name for f in fields(Candidate)]
    row = [f.name for f in fields(PlanRow) if f.name != "candidate"]
    return ["key", *cand, *row, "model", "gpus", "gpu", "seq", "global_batch_size",
            "comm_policy", "semantics", "params"]


def _to_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


class RowStream:
    """Rows appended to ``path`` as they finish (module docstring). ``identity``: the
    sweep's :meth:`~schedsim.plan.space.PlanSpace.identity`. Use :meth:`open` with the
    rows kept from a resumed file (:func:`read_rows`), then :meth:`write` each row."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path = Path(path)
        self.identity = identity
        self.stdout = str(path) == "-"          # JSON lines on stdout
        self.csv = self.path.suffix.lower() == ".csv"
        self._f: Any = None
        self.rows = 0           # rows in the file (kept and new)

    def open(self, kept: list[PlanRow]) -> "RowStream":
        """Start the file anew with the ``kept`` rows (a resumed file loses only a cut
        last line)."""
        if self.stdout:
            import sys

            self._f = sys.stdout
        else:
            self._f = open(self.path, "w", newline="", encoding="utf-8")
        if self.csv:
            self._f.write(",".join(_csv_columns()) + "\r\n")
        for r in kept:
            self.write(r)
        return self

    def write(self, row: PlanRow) -> None:
        d = row.to_dict()
        if self.csv:
            d.update(self.identity)
            d["peak_gib"] = ";".join(repr(x) for x in row.peak_gib)
            d["params"] = json.dumps(self.identity["params"], sort_keys=True)
            buf = io.StringIO()
            csv.writer(buf).writerow([_to_text(d.get(c)) for c in _csv_columns()])
            line = buf.getvalue()
        else:
            line = json.dumps({**d, "sweep": self.identity}, sort_keys=True) + "\n"
        self._f.write(line)
        self._f.flush()
        self.rows += 1

    def close(self) -> None:
        if self._f is not None:
            if not self.stdout:
                self._f.close()
            self._f = None

    def abandon(self) -> None:
        """Close after a stop or an error: a file that holds no row (nothing kept,
        nothing finished) is removed rather than left empty; one with rows stays for
        ``--resume``."""
        self.close()
        if self.rows == 0 and not self.stdout:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RowStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _from_csv(rec: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A CSV record as (row dict, sweep identity). Raises ValueError on a bad cell."""
    ints = {f.name for f in fields(Candidate) if f.type in ("int", int)} | {
        "stages", "microbatches", "gpus", "seq", "global_batch_size"}
    floats = {"step_ms", "tokens_per_s_per_gpu", "mfu", "bubble_ratio"}
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k in ("chunks",):
            out[k] = int(v) if v else None
        elif k in ints:
            out[k] = int(v) if v else None
        elif k in floats:
            out[k] = float(v)
        elif k == "fits":
            out[k] = v == "True"
        elif k == "peak_gib":
            out[k] = [float(x) for x in v.split(";")] if v else []
        elif k == "params":
            out[k] = json.loads(v) if v else {}
        elif k == "comm_policy":
            out[k] = v or None
        else:
            out[k] = v
    ident = {k: out.pop(k) for k in ("model", "gpus", "gpu", "seq", "global_batch_size",
                                      "comm_policy", "semantics", "params")}
    return out, ident


def read_rows(path: Path, identity: dict[str, Any]) -> list[PlanRow]:
    """The rows of a ``--out`` file to resume (none when it does not exist). A last line
    cut short is dropped. Raises :class:`ScenarioError` for a file of another sweep (its
    identity differs) or a line that is not a row."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()                           # cut by a kill: dropped, redone
    rows: list[PlanRow] = []
    is_csv = path.suffix.lower() == ".csv"
    if is_csv:
        if not lines:
            return []
        reader = csv.DictReader(io.StringIO("".join(lines)))
        if reader.fieldnames != _csv_columns():
            raise ScenarioError(f"{path}: not a plan CSV of this version (its columns "
                                f"differ); give another --out or drop --resume")
        records = list(reader)
    else:
        records = lines
    for n, rec in enumerate(records, start=2 if is_csv else 1):
        try:
            if is_csv:
                d, ident = _from_csv(rec)
            else:
                d = json.loads(rec)
                ident = d.pop("sweep")
            row = PlanRow.from_dict(d)
        except (ValueError, KeyError, TypeError) as e:
            raise ScenarioError(f"{path}:{n}: not a plan row ({e}); give another --out "
                                f"or drop --resume") from None
        if ident != identity:
            diff = sorted(k for k in identity if ident.get(k) != identity[k])
            raise ScenarioError(f"{path}:{n}: written by another sweep ({', '.join(diff)} "
                                f"differ); resume with the same flags or give another "
                                f"--out")
        rows.append(row)
    return rows
