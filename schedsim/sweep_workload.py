"""Every schedule on one ``[workload]`` (what ``compare`` of a workload scenario runs):
each schedule's scenario read again as ``simulate -s NAME`` reads it, then simulated
the same way, so compare's step, tokens/s/GPU and peak equal ``simulate``'s."""
from __future__ import annotations

from typing import Any, Sequence

from schedsim.errors import SchedsimError, Stopped
from schedsim.sweep import parse_schedules

#: the ``[schedule]`` keys of the table itself that one schedule of a workload
#: ``compare`` keeps (the rest are the schedule's source, set per schedule)
_KEPT_SCHEDULE_KEYS = ("ranks", "microbatches", "comm_policy", "max_batch_ops")


def workload_schedule_scenario(sc: Any, name: str, shared: dict[str, Any] | None = None,
                               own: dict[str, Any] | None = None,
                               source: str = "scenario") -> Any:
    """The scenario ``sc`` (a file with the command line's flags applied) read again as
    ``simulate -s NAME`` reads it, overriding only the schedule: ``[schedule] name =
    NAME`` with the generator and comm-policy parameters of ``sc``'s ``[schedule]`` and
    ``shared`` (the flags', winning) that NAME's generator takes (a comm-policy key: every
    schedule's, :func:`params_for_schedules`' rule), then ``own`` (the ``--schedules``
    item's own, as written); the ``[workload]``'s ``chunks`` kept only for a generator
    that takes chunks and is given none (else its stages decide them, as ``compare``
    documents); costs, links, comm and memory as they are. ``source``: the file's name,
    for errors. Raises :class:`SchedsimError` as reading the scenario does."""
    from schedsim.generators import GENERATORS, get, names
    from schedsim.scenario_schedule import ScheduleSection

    gen = get(name)
    names()         # (every generator module imported: GENERATORS is the whole registry)
    gen_keys = {k for g in GENERATORS.values() for k in g.accepted()}
    data = sc.model_dump(exclude={"base_dir"}, exclude_none=True, exclude_unset=True)
    old = data.get("schedule", {})
    given = {k: v for k, v in old.items()
             if k not in ScheduleSection.model_fields and k not in _KEPT_SCHEDULE_KEYS}
    given.update({k: v for k, v in (shared or {}).items() if v is not None})
    params = {k: v for k, v in given.items() if k not in gen_keys or k in gen.accepted()}
    params.update(own or {})
    table = {k: old[k] for k in _KEPT_SCHEDULE_KEYS if k in old}
    if "comm_policy" in params:
        table["comm_policy"] = params.pop("comm_policy")
    data["schedule"] = {**table, "name": name, **params}
    wl = dict(data.get("workload") or {})
    if "chunks" in wl and ("chunks" not in gen.accepted() or "chunks" in params):
        del wl["chunks"]
    data["workload"] = wl
    from schedsim.scenario import parse_scenario

    return parse_scenario(data, source, sc.base_dir, file=sc.source_file)


def compare_workload_schedules(sc: Any, schedules: str | Sequence[str] | None = None,
                               shared: dict[str, Any] | None = None, *,
                               source: str = "scenario"
                               ) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    """Every schedule (or ``schedules``, a ``--schedules`` list with parameters per
    schedule, :func:`parse_schedules`) simulated on the ``[workload]`` of scenario ``sc``
    exactly as ``simulate -s NAME`` with the same flags runs it: each schedule's
    scenario is :func:`workload_schedule_scenario` (``shared``: the flags' generator and
    comm-policy parameters), run by :func:`schedsim.scenario.simulate_scenario`, so its
    step, tokens/s/GPU and peak equal ``simulate``'s. ``([(label, WorkloadResult)],
    {skipped label: why})``: a schedule whose sizes or layers do not fit, or whose
    program deadlocks, is skipped with the reason (``compare`` of a workload scenario).
    Raises :class:`~schedsim.errors.ScheduleError` for a name that is not registered
    (with the closest one) and :class:`~schedsim.errors.LimitError` for a program above
    the work limits, before anything runs."""
    from schedsim.errors import LimitError
    from schedsim.generators import get, names
    from schedsim.scenario import simulate_scenario

    todo = parse_schedules(schedules) if schedules is not None else \
        [(n, n, {}) for n in names()]
    for _, n, _ in todo:
        get(n)      # unknown names fail loudly, as plain compare's do
    rows, skipped = [], {}
    for label, n, own in todo:
        try:
            one = workload_schedule_scenario(sc, n, shared, own, source)
            prog = one.build_program()
            tl, res = simulate_scenario(prog, one)
        except (LimitError, Stopped):
            raise
        except SchedsimError as e:
            skipped[label] = str(e)
            continue
        if res is None:
            skipped[label] = (f"deadlocks under {one.comm.semantics}: "
                              f"{tl.deadlock.message}")
            continue
        rows.append((label, res))
    return rows, skipped
