"""Stage graphs beyond a chain: a scenario's ``[stages] edges`` applied to its program
(the rules of skip edges are in :mod:`schedsim.program.routing`)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schedsim.errors import ScenarioError
from schedsim.program.ir import Placement, Program


class StageGraph(BaseModel):
    """``[stages] edges = [[0, 1], [1, 2], [0, 2]]``: the chain plus skip edges
    (:mod:`schedsim.program.stage_graph`)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    edges: list[list[int]] = Field(default_factory=list)


def shape_program(prog: Program, graph: StageGraph | None, sched: Any) -> Program:
    """A scenario's program with its ``[stages] edges`` (:func:`with_stage_graph`) and
    its ``max_batch_ops`` (:func:`schedsim.program.sublaunch.split_batches`) applied;
    ``sched``: the ``[schedule]`` table."""
    if graph is not None and graph.edges:
        prog = with_stage_graph(prog, graph.edges, sched.comm_policy,
                                sched.generator_params(),
                                lowered=bool(sched.name or sched.schedule_file))
    n = (sched.model_extra or {}).get("max_batch_ops")
    if n is not None:
        from schedsim.program.sublaunch import split_batches

        prog = split_batches(prog, n)
    return prog


def with_stage_graph(prog: Program, edges: list[list[int]], policy: str | None,
                     params: dict[str, Any], lowered: bool) -> Program:
    """``prog`` on the stage graph ``edges`` (``[stages] edges``): its placement gains
    the skip edges; a generated or loaded schedule (``lowered``) is lowered again so that
    it posts their messages, by the ``async`` or ``commit`` policy; a program file keeps
    its own instructions (its skip-edge posts name the other stage: ``0SEND_F0>2``).
    Raises :class:`ScenarioError` for a bad graph or a policy that posts chain messages
    only."""
    from schedsim.program.routing import check_skips

    pl = prog.placement
    try:
        skips = check_skips(edges, pl.stages)
    except ValueError as e:
        raise ScenarioError(f"[stages] edges: {e}") from None
    new_pl = Placement(**{**pl.model_dump(), "skips": skips})
    if not lowered:
        return Program.from_flat(prog.flat(), name=prog.name, placement=new_pl,
                                 microbatches=prog.microbatches, params=prog.params)
    pol = policy or "async"
    if pol not in ("async", "commit"):
        raise ScenarioError(f"[stages] edges: comm_policy {pol!r} posts a chain's messages "
                            f"only; a stage graph is lowered by async or commit")
    from schedsim.program.ir import Schedule
    from schedsim.program.lower import get_policy, lower

    sched = prog.schedule()
    sched = Schedule.from_flat(sched.flat(), name=sched.name, placement=new_pl,
                               microbatches=sched.microbatches, params=sched.params)
    takes = get_policy(pol).params
    return lower(sched, pol, **{k: v for k, v in params.items() if k in takes})
