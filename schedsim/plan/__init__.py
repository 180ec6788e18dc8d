"""``schedsim plan``: the best parallel layout and schedule for a model on N GPUs, with
the exact simulated schedule of every candidate that survives the pruning.

- :mod:`~schedsim.plan.space`: what is swept (:class:`PlanSpace`), a candidate, the
  rejection tally;
- :mod:`~schedsim.plan.candidates`: every legal candidate, each rule's rejections;
- :mod:`~schedsim.plan.work`: the total instructions of every candidate's simulation,
  bounded before anything is generated;
- :mod:`~schedsim.plan.bounds`: the makespan lower bound and the peak activation of an
  order, without simulating;
- :mod:`~schedsim.plan.model`: what the planner asks of :mod:`schedsim.workload`;
- :mod:`~schedsim.plan.driver`: prune, simulate in waves (branch and bound), rank;
- :mod:`~schedsim.plan.executors`: this process, local worker processes, Dask;
- :mod:`~schedsim.plan.rows`: result rows, the ranking order, the ``--out`` stream;
- :mod:`~schedsim.plan.pareto`, :mod:`~schedsim.plan.report`: the figure and the page.

The package is callable: ``schedsim.plan(model=..., gpus=..., gpu=...)`` is
:func:`plan`.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from schedsim.plan.space import Candidate, PlanSpace, Rejections


def plan(model: str, gpus: int, gpu: str, *, top: int = 5, executor: str = "local",
         jobs: int | None = 1, address: str | None = None, out: str | Path | None = None,
         resume: bool = False, **space: Any) -> list:
    """Plan ``model`` on ``gpus`` x ``gpu`` and return the ranking: the simulated
    candidates that fit, best first, as :class:`~schedsim.plan.rows.PlanRow` rows
    (``.candidate``, ``.step_ms``, ``.tokens_per_s_per_gpu``, ``.mfu``, ``.bubble_ratio``,
    ``.peak_gib`` per rank, ``.to_dict()``).

    ``space``: the other :class:`PlanSpace` fields (``seq``, ``global_batch_size``,
    ``tp=[4, 8]``, ``pp``, ``chunks``, ``ep``, ``cp``, ``micro_batch_size``,
    ``schedules``, ``recompute``, ``zero``, ``mem_limit_gib``, ``comm_policy``,
    ``semantics``, ``params``). ``executor``/``jobs``/``address``: as the CLI's
    (``jobs=1``: this process). For the counts (rejections per rule, what was pruned)
    use :func:`schedsim.plan.driver.run_plan`.

    Raises :class:`~schedsim.errors.ScenarioError` when no layout is legal or the input
    is bad (:class:`~schedsim.errors.LimitError`: the plan's total work is above the
    ``instructions`` limit, :mod:`schedsim.plan.work`).
    """
    from schedsim.plan.driver import check_plan, run_plan
    from schedsim.plan.executors import make_executor

    ps = PlanSpace(model=model, gpus=gpus, gpu=gpu, **space)
    ex = make_executor(executor, jobs, address)
    checked = check_plan(ps, top)       # names and total work, before any worker starts
    with ex:
        res = run_plan(ps, top=top, executor=ex, out=Path(out) if out else None,
                       resume=resume, checked=checked)
    return res.ranking


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`plan`."""

    def __call__(self, *args: Any, **kwargs: Any) -> list:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["Candidate", "PlanSpace", "Rejections", "plan"]
