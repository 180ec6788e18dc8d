"""``check_collective(fn, tp=4)``: is the user's tensor-parallel reduction right? The
Python side of ``schedsim check-collectives --function`` (imports without torch: the
measurement runs in ``tp`` gloo processes, :mod:`schedsim.replay.user_collective`).

The question is the one Megatron-LM's ``megatron/core/tensor_parallel/mappings.py``
answers with its f/g pair: in a column-parallel linear followed by a row-parallel one,
with a loss every rank computes alike (*replicated*), the reduction after the
row-parallel layer (g) must sum in forward and pass the gradient through in backward,
and the copy before the column-parallel layer (f) must pass the input through in forward
and sum the partial input gradients in backward. Measured gradient scales against the
single-process reference name the bug class:

- every tensor at scale 1: **correct** for a replicated loss;
- every tensor at scale ``tp``: **all-reduce twice** (a backward all-reduce of a gradient
  every rank already holds in full; right only for the loss summed over ranks);
- weights right, each rank's input gradient its own share: **missing backward
  all-reduce** (f's backward);
- and, as a hazard even when the block is right, **in-place on a saved tensor**: an
  operator that changes its input in place outside autograd gives wrong gradients,
  silently, when that input is a tensor autograd saved (``tanh``'s output).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a scale equals 1 or tp within this
TOL = 1e-9
#: probe error above which the in-place hazard is reported
PROBE_TOL = 1e-6


@dataclass
class CollectiveCheck:
    """The result of :func:`check_collective`.

    ``verdict``: ``correct``, ``all-reduce twice``, ``missing backward all-reduce``, or
    ``wrong`` (not a multiple of the reference); ``scale``: the gradient scale every
    tensor shares against the replicated loss (None when they differ); ``tensors``: per
    tensor (``W1``, ``b1``, ``W2``, ``x``) its scale against the ``replicated`` and the
    ``summed`` loss (None: not a multiple); ``bugs``: the bug classes found;
    ``why``: one sentence per fact behind the verdict; ``hazards``: warnings that hold
    even when the verdict is correct; ``ops``: how g (and f) act alone (forward and
    backward: identity, all-reduce or other; in place outside autograd)."""

    tp: int
    verdict: str
    scale: float | None
    tensors: dict[str, dict[str, float | None]]
    bugs: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    hazards: list[str] = field(default_factory=list)
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("tp", "verdict", "scale", "tensors", "bugs",
                                              "why", "hazards", "ops", "functions")}

    def __repr__(self) -> str:
        s = "not one scale" if self.scale is None else f"scale {self.scale:g}"
        return f"<CollectiveCheck {self.functions.get('g', '?')}: {self.verdict}, {s}, tp={self.tp}>"


def _is(x: float | None, v: float) -> bool:
    return x is not None and abs(x - v) <= TOL * max(1.0, abs(v))


def _op_facts(name: str, op: dict[str, Any], tp: int) -> list[str]:
    """Sentences on how operator ``name`` (``g`` or ``f``) acts, against what its place
    in the block needs."""
    out = []
    fwd, bwd = op["forward"], op["backward"]
    if name == "g":
        if op["inplace_untracked"]:
            out.append("g changes its input in place outside autograd (a raw "
                       "dist.all_reduce), so autograd records nothing for it and its "
                       "backward is the identity: exactly the backward g needs, since with "
                       "a replicated loss every rank already holds the full output gradient")
        elif fwd == "all-reduce" and bwd == "identity":
            out.append("g sums the partial outputs in forward and passes the gradient "
                       "through in backward (Megatron's g)")
        if bwd == "all-reduce":
            out.append(f"g's backward all-reduces a gradient every rank already holds in "
                       f"full (the loss is replicated), so every gradient is {tp}x the "
                       f"reference: all-reduce twice (right only for the loss summed over "
                       f"ranks)")
        if fwd != "all-reduce":
            out.append(f"g's forward is {fwd}, not the sum over ranks: the output is not "
                       f"the full layer output")
    else:
        if fwd != "identity":
            out.append(f"f's forward is {fwd}, not the identity")
        if bwd == "identity":
            out.append("f's backward does not sum the partial input gradients over ranks: "
                       "missing backward all-reduce")
        elif bwd == "all-reduce":
            out.append("f passes the input through and sums the partial input gradients "
                       "in backward (Megatron's f)")
    return out


def verdict(res: dict[str, Any]) -> CollectiveCheck:
    """The :class:`CollectiveCheck` of a measurement
    (:func:`schedsim.replay.user_collective.summarize`'s dict)."""
    tp, t = res["tp"], res["tensors"]
    rep = {k: v["replicated"] for k, v in t.items()}
    weights = [rep[k] for k in ("W1", "b1", "W2")]
    bugs: list[str] = []
    if all(_is(s, 1.0) for s in rep.values()):
        name = "correct"
    elif all(_is(s, tp) for s in rep.values()):
        name = "all-reduce twice"
        bugs.append(name)
    else:
        name = "wrong"
        if all(_is(s, tp) for s in weights):
            bugs.append("all-reduce twice")
        if rep["x"] is None and t["x"].get("ranks_sum_to") is not None:
            bugs.append("missing backward all-reduce")
        if bugs == ["missing backward all-reduce"] and all(_is(s, 1.0) for s in weights):
            name = bugs[0]
    scales = list(rep.values())
    scale = scales[0] if all(s is not None and _is(s, scales[0]) for s in scales) else None
    why = [s for k in ("g", "f") if k in res["ops"] for s in _op_facts(k, res["ops"][k], tp)]
    if "f" not in res["ops"]:
        why.append("f: Megatron's (identity forward, all-reduce backward), the default")
    if name == "correct":
        why.append("every gradient (W1, b1, W2 and the input's) equals the single-process "
                   "gradient of the replicated loss")
    if "missing backward all-reduce" in bugs:
        why.append("each rank's input gradient is its own share: the shares sum to "
                   f"{t['x']['ranks_sum_to']:.6g}x the reference")
    hazards = []
    g = res["ops"]["g"]
    if g["inplace_untracked"] and res["saved_probe_rel_error"] > PROBE_TOL:
        hazards.append(f"in-place on a saved tensor: applied to tanh's output (which tanh "
                       f"saves for its backward) g's in-place change corrupts the gradient "
                       f"silently (max relative error {res['saved_probe_rel_error']:.3g}); "
                       f"here it is safe because the matmul that makes g's input saved its "
                       f"inputs, not its output")
    return CollectiveCheck(tp, name, scale, t, bugs, why, hazards, res["ops"],
                           res["functions"])


def function_spec(fn: Any) -> str:
    """``FILE.py:NAME`` of a module-level class or function (what the gloo processes
    load), or ``fn`` itself when it is already a ``MODULE:NAME`` / ``FILE.py:NAME``
    string. Raises :class:`~schedsim.errors.ScenarioError` for a local object."""
    from schedsim.errors import ScenarioError

    if isinstance(fn, str):
        where, _, name = fn.rpartition(":")
        if not where or not name:
            raise ScenarioError(f"--function {fn!r}: give MODULE:NAME or FILE.py:NAME "
                                f"(e.g. mypkg.tp:AllReduce)")
        if where.endswith(".py"):
            if not Path(where).is_file():
                raise ScenarioError(f"--function {fn!r}: no file {where}")
            return f"{Path(where).resolve()}:{name}"
        return fn
    qual = getattr(fn, "__qualname__", "")
    if not qual or "<locals>" in qual:
        raise ScenarioError(f"{fn!r}: define it at module level (the check loads it by "
                            f"name in each of its processes)")
    try:
        src = inspect.getsourcefile(fn)
    except TypeError:
        src = None
    if src is None:
        raise ScenarioError(f"{fn!r}: no source file to load it from; give "
                            f"'MODULE:NAME'")
    return f"{Path(src).resolve()}:{qual}"


def check_collective(fn: Any, tp: int = 4, *, f: Any = None, timeout: float = 120.0
                     ) -> CollectiveCheck:
    """Measure the user's reduction ``fn`` (an autograd Function class or a callable
    taking one tensor, or its ``MODULE:NAME`` / ``FILE.py:NAME``) as the g of a
    column->row block on ``tp`` local gloo processes (float64), with ``f`` (default:
    Megatron's f) before the column-parallel layer; see the module docstring.

    Raises :class:`~schedsim.errors.ScenarioError` for a bad ``fn`` or ``tp`` and
    :class:`~schedsim.replay.config.ReplayError` when a process fails (an import error
    in the user's module included) or the run exceeds ``timeout`` seconds."""
    from schedsim.errors import ScenarioError
    from schedsim.replay.config import require_torch

    if not 2 <= tp <= 16:
        raise ScenarioError(f"tp = {tp}: give 2 to 16 ranks")
    require_torch()
    functions = {"g": function_spec(fn)}
    if f is not None:
        functions["f"] = function_spec(f)
    from schedsim.replay.collectives_check import run_check

    return verdict(run_check(tp, timeout, functions))
