"""Array lookups of derived costs (:meth:`schedsim.sim.costs.CostModel.op_costs` with a
stage model): one lookup per distinct (kind, stage) and per distinct FB pair, gathered
with numpy, instead of one per op."""
from __future__ import annotations

from typing import Any

import numpy as np

from schedsim.program.flat import OpKind
from schedsim.program.ir import Op


def derived_op_costs(costs: Any, kind: Any, stage: Any, bkind: Any, bstage: Any) -> Any:
    """:meth:`CostModel.op_costs` of ``costs`` with derived costs (a stage model's) and
    no per-(stage, mb) overrides: a cost depends on (kind, stage) only, an FB's on its
    parts' (stage, kind) pairs, so each distinct one is looked up once and gathered
    (the derived model directly when nothing is typed; else through
    :meth:`CostModel.kind_cost` and the FB rule). Arrays as ``op_costs`` takes them."""
    n = len(kind)
    if not n:
        return np.zeros(0)
    S = int(max(stage.max(), bstage.max(initial=-1) if len(bstage) else -1)) + 1
    names = ("F", "B", "W", "BW")
    d = costs._derived
    if not costs.stage and not costs.model_fields_set & set(names):
        # nothing typed: the derived costs as they are (one lookup per kind, stage)
        table = np.array([[d.kind_cost(k, s) for s in range(S)] for k in names])
    else:
        table = np.array([[costs.kind_cost(k, s, -1) for s in range(S)] for k in names])
    is_fb = kind == OpKind.FB
    out = table[np.where(is_fb, 0, kind), stage].astype(np.float64, copy=False)
    if is_fb.any():
        i = np.flatnonzero(is_fb)
        key = (stage[i].astype(np.int64) * S + bstage[i]) * 4 + bkind[i]
        uniq, inv = np.unique(key, return_inverse=True)
        vals = np.empty(len(uniq))
        plain = not costs.stage and not costs.model_fields_set & {*names, "FB"}
        for j, k in enumerate(uniq.tolist()):
            sf, sb = divmod(k // 4, S)
            if plain:
                vals[j] = d.fb_cost(sf, sb, names[k % 4])
                continue
            op = Op.fb(Op("F", sf, 0), Op(names[k % 4], sb, 0))
            vals[j] = costs._fb(op)
        out[i] = vals[inv]
    return out
