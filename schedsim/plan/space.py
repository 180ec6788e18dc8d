"""The plan's search space: what the user sweeps (:class:`PlanSpace`), one point of it
(:class:`Candidate`), value lists as written on the command line (:func:`parse_values`)
and the tally of candidates each rule removed (:class:`Rejections`).

A candidate is one layout (TP, PP, model chunks per rank, EP, CP, DP, micro-batch size),
one schedule of the registry, one recompute mode and one ZeRO stage. DP is not swept: it
is what the GPUs leave, ``gpus / (tp x pp x cp)``; the microbatches are
``global_batch_size / (dp x micro_batch_size)``.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from schedsim.errors import ScenarioError

#: schedules swept when --schedules is not given
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev")
#: recompute modes swept when --recompute is not given
DEFAULT_RECOMPUTE = ("none", "selective", "full")
#: most values one range (``a..b``) may expand to
MAX_RANGE = 4096


def parse_values(text: str | None, flag: str, *, kind: type = int,
                 minimum: int = 1) -> list[Any] | None:
    """A value list as written on the command line: ``4,8``, ``4..16`` (every integer
    from 4 to 16), ``1,2,8..16`` or, for ``kind=str``, ``none,full``. None stays None
    (the default applies). Returns the values sorted and without repeats (strings in the
    order given). Raises :class:`ScenarioError` naming ``flag`` for a bad item."""
    if text is None:
        return None
    out: list[Any] = []
    for raw in str(text).split(","):
        item = raw.strip()
        if not item:
            raise ScenarioError(f"bad {flag} {text!r}: an empty item (expected e.g. 4,8 "
                                f"or 4..16)")
        if kind is str:
            if item not in out:
                out.append(item)
            continue
        m = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", item)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi or hi - lo >= MAX_RANGE:
                raise ScenarioError(f"bad {flag} range {item!r}: expected LO..HI with LO <= "
                                    f"HI and at most {MAX_RANGE} values")
            vals = list(range(lo, hi + 1))
        elif item.isdigit():
            vals = [int(item)]
        else:
            raise ScenarioError(f"bad {flag} value {item!r}: expected a whole number, a "
                                f"list (4,8) or a range (4..16)")
        for v in vals:
            if v < minimum:
                raise ScenarioError(f"bad {flag} value {v}: must be >= {minimum}")
        out.extend(vals)
    return out if kind is str else sorted(set(out))


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the space. ``chunks``: model chunks per rank as the generator is
    asked for them (None: the schedule's own placement decides, e.g. 2 for a V
    schedule); ``stages`` in a result row is what the placement gave."""

    tp: int
    pp: int
    dp: int
    ep: int
    cp: int
    micro_batch_size: int
    schedule: str
    chunks: int | None
    recompute: str
    zero: int

    @property
    def key(self) -> str:
        """A stable name of the candidate (the id in ``--out`` files, the last tie-break
        of the ranking)."""
        ch = "" if self.chunks is None else f" chunks{self.chunks}"
        return (f"tp{self.tp} pp{self.pp} dp{self.dp} ep{self.ep} cp{self.cp} "
                f"mbs{self.micro_batch_size} {self.schedule}{ch} recompute={self.recompute} "
                f"zero{self.zero}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Candidate":
        names = [f.name for f in fields(cls)]
        return cls(**{n: d[n] for n in names})


@dataclass
class PlanSpace:
    """What one ``schedsim plan`` sweeps. ``model`` and ``gpu`` are preset names or
    config paths (:func:`schedsim.workload.load_model`, :func:`gpu_preset`); the lists
    hold the values to try (None: the defaults of :func:`resolve`); ``mem_limit_gib``
    None means the GPU's HBM minus :data:`schedsim.plan.model.RESERVE_GIB`;
    ``params``: generator and comm-policy parameters given to every candidate."""

    model: str
    gpus: int
    gpu: str
    seq: int | None = None
    global_batch_size: int | None = None
    tp: list[int] | None = None
    pp: list[int] | None = None
    chunks: list[int] | None = None
    ep: list[int] | None = None
    cp: list[int] | None = None
    micro_batch_size: list[int] | None = None
    schedules: list[str] | None = None
    recompute: list[str] | None = None
    zero: list[int] | None = None
    mem_limit_gib: float | None = None
    comm_policy: str | None = None
    semantics: str = "data"
    params: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """The fields that make two sweeps' results comparable (a ``--resume`` file must
        have been written with the same ones)."""
        return {"model": self.model, "gpus": self.gpus, "gpu": self.gpu, "seq": self.seq,
                "global_batch_size": self.global_batch_size,
                "comm_policy": self.comm_policy, "semantics": self.semantics,
                "params": dict(sorted(self.params.items()))}


class Rejections:
    """How many candidates each rule removed, in the order the rules were first met, and
    one example message per rule (what the user reads when a rule left nothing)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, rule: str, message: str = "", n: int = 1) -> None:
        self.counts[rule] = self.counts.get(rule, 0) + n
        if message and rule not in self.examples:
            self.examples[rule] = message

    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: "Rejections") -> None:
        for rule, n in other.counts.items():
            self.add(rule, other.examples.get(rule, ""), n)

    def to_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def worst(self) -> tuple[str, str]:
        """``(rule, example)`` of the rule that removed most (first met on a tie)."""
        rule = max(self.counts, key=lambda r: self.counts[r])
        return rule, self.examples.get(rule, "")
