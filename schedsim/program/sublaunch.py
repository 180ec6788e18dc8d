"""Sub-launches: a ``BATCH`` of more than N ops split into consecutive launches of at most
N, in order, as torch chunks a large ``batch_isend_irecv`` (pytorch/pytorch PR #174942,
``TORCH_NCCL_BATCH_P2P_CHUNK_SIZE``, default 256) and as NCCL splits a large group into
sequential kernel launches (pytorch/pytorch#174288).

Under ``--group-semantics atomic`` each chunk is its own group; when two ranks chunk the
same exchange differently (their batches hold other ops too, or in another order), a
chunk can wait for a partner the other rank launches in a later chunk: ``schedsim lint``
finds it (``split-exchange``, :mod:`schedsim.analysis.lint_groups`). Parameter
``max_batch_ops`` of ``[schedule]`` (``--param max_batch_ops=N``), any policy.
"""
from __future__ import annotations

from schedsim.errors import ScenarioError
from schedsim.program.ir import Batch, Program


def split_batches(program: Program, n: int) -> Program:
    """``program`` with every ``BATCH`` of more than ``n`` ops split into consecutive
    ``BATCH`` launches of ``n`` (the last one the rest), members in their order; waits
    and commits stay where they were (a ``COMMIT`` covers every chunk). Instruction
    indices after a split batch move. Raises :class:`ScenarioError` for ``n < 1``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ScenarioError(f"max_batch_ops {n!r}: expected a whole number of ops >= 1")
    rows = []
    changed = False
    for row in program.ranks:
        out = []
        for ins in row:
            if isinstance(ins, Batch) and len(ins.comms) > n:
                changed = True
                out += [Batch(ins.comms[k:k + n]) for k in range(0, len(ins.comms), n)]
            else:
                out.append(ins)
        rows.append(out)
    if not changed:
        return program
    return Program(name=program.name, placement=program.placement,
                   microbatches=program.microbatches, ranks=rows,
                   params={**program.params, "max_batch_ops": n})
