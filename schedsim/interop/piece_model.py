"""A piece trace's measured costs in the stage model: predict the overlapped F&B pair.

The stage model (:mod:`schedsim.sim.stage_model`, ``overlap = "fb"``) builds an MoE
layer's pieces from per-layer block costs: forward = attention, dispatch all-to-all,
experts, combine all-to-all; backward = combine's backward, experts, dispatch's
backward, attention, with each W piece after its block's B piece; an F&B pair is both
chains list-scheduled on one compute and one collective stream
(:mod:`schedsim.sim.overlap`). :func:`predict_pair` fills it from a piece trace
(:func:`~schedsim.interop.kineto_pieces.piece_costs`, mean over layers): the blocks'
F/B/W into ``attention`` and ``mlp``, and each collective piece's measured time in place
of the alpha-beta time (the trace measures dispatch and combine, forward and backward,
apart; one bandwidth could not give four different times).

Block names: ``attn``/``attention`` is the attention block, ``mlp``/``moe``/``expert*``/
``ffn`` the MLP; ``dispatch``/``combine`` the all-to-alls. :func:`model_table` writes the
same costs as a scenario ``[model]`` table (``calibrate --from-trace``): there the
all-to-alls share one time, their mean, as a latency on the ``inter`` link.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.interop.kineto_pieces import PieceTrace, piece_costs
from schedsim.util.units import fmt_time, with_unit

_ROLES = (("attention", ("attention", "attn")), ("mlp", ("mlp", "moe", "expert", "ffn")),
          ("dispatch", ("dispatch",)), ("combine", ("combine",)))


def _role(block: str) -> str | None:
    b = block.lower()
    for role, words in _ROLES:
        if any(w in b for w in words):
            return role
    return None


@dataclass
class PairPrediction:
    """The predicted overlapped pair and the non-overlapped sum, per layer (ms)."""

    layers: int
    overlapped: float      # the F&B pair's cost / layers (stage model, overlap "fb")
    sequential: float      # sum of every piece / layers (nothing overlapped)
    compute: float         # compute pieces per layer (the pair's lower bound)
    collective: float      # collective pieces per layer
    costs: dict[str, float]  # role(phase) -> mean ms used
    op_cost: Any = None    # the OpCost of the whole pair


def role_costs(pt: PieceTrace) -> tuple[dict[str, float], int]:
    """``{"attention(F)": ms, ..., "dispatch(B)": ms}`` (means over layers) and the layer
    count. Raises :class:`ScenarioError` for a block the stage model has no place for,
    blocks with different layer counts, or a missing attention/MLP block."""
    costs: dict[str, float] = {}
    layers = set()
    for name, c in piece_costs(pt).items():
        role = _role(c["block"])
        if role is None:
            raise ScenarioError(f"{pt.path}: piece {name!r}: the stage model has attention, "
                                f"MLP (experts), dispatch and combine blocks; name the "
                                f"ranges attn(F), mlp(B), dispatch(F), combine(B)...")
        costs[f"{role}({c['phase']})"] = costs.get(f"{role}({c['phase']})", 0.0) + c["mean"]
        layers.add(c["layers"])
    if len(layers) != 1:
        raise ScenarioError(f"{pt.path}: the blocks have different layer counts "
                            f"({sorted(layers)}): the stage model repeats one layer")
    for need in ("attention", "mlp"):
        if not any(k.startswith(need) for k in costs):
            raise ScenarioError(f"{pt.path}: no {need} piece: the stage model needs both "
                                f"blocks")
    return costs, layers.pop()


def _stage_model(costs: dict[str, float], layers: int, moe: bool) -> Any:
    from schedsim.sim.stage_model import StageModel

    blk = {r: {p: costs.get(f"{r}({p})", 0.0) for p in "FBW"} for r in ("attention", "mlp")}
    extra = dict(moe=True, ep=2) if moe else {}
    return StageModel(layers=layers, overlap="fb", attention=blk["attention"],
                      mlp=blk["mlp"], **extra)


def predict_pair(pt: PieceTrace) -> PairPrediction:
    """The F&B pair of the trace's measured pieces, predicted by the stage model
    (module docstring), per layer."""
    from schedsim.sim.overlap import COLLECTIVE, schedule, union
    from schedsim.sim.stage_costs import phase_pieces

    costs, layers = role_costs(pt)
    moe = any(k.startswith(("dispatch", "combine")) for k in costs)
    m = _stage_model(costs, layers, moe)

    def measured(pieces: list[Any]) -> list[Any]:
        out = []
        for p in pieces:
            if p.stream == COLLECTIVE:
                p = replace(p, duration=costs.get(f"{p.name.split()[0]}({p.part})", 0.0))
            out.append(p)
        return out

    back = "BW" if any(k.endswith("(W)") for k in costs) else "B"
    oc = schedule(union(measured(phase_pieces(m, None, "F")),
                        measured(phase_pieces(m, None, back, free_w=True))))
    total = sum(costs.values())
    comm = sum(v for k, v in costs.items() if k.startswith(("dispatch", "combine")))
    return PairPrediction(layers, oc.cost / layers, total, (total - comm), comm, costs, oc)


def model_table(pt: PieceTrace) -> str:
    """The trace's costs as a scenario ``[model]`` table (module docstring), TOML text."""
    costs, layers = role_costs(pt)
    comm = {k: v for k, v in costs.items() if k.startswith(("dispatch", "combine"))}
    lines = [f"# per-layer GPU time (ms, mean of {layers} layers) of {pt.path.name}'s pieces",
             "[model]", f"layers = {layers}", 'overlap = "fb"']
    for r in ("attention", "mlp"):
        vals = ", ".join(f"{p} = {costs.get(f'{r}({p})', 0.0)!r}" for p in "FBW")
        lines.append(f"{r} = {{ {vals} }}")
    if comm:
        mean = sum(comm.values()) / len(comm)
        lines += ["moe = true", "ep = 2",
                  "# all-to-alls measured: " + ", ".join(f"{k} {fmt_time(v)}" for k, v in
                                                         sorted(comm.items()))
                  + f"; the stage model gives them one time, their mean {with_unit(mean, 'ms')}",
                  "[model.links]", "gpus_per_node = 1",
                  f"inter = {{ bandwidth = inf, latency = {mean!r} }}"]
    return "\n".join(lines) + "\n"
