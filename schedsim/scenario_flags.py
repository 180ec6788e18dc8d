"""A :class:`~schedsim.scenario.Scenario` from a TOML file and the values the command
line's scenario flags set (``--schedule``, ``--cost``, ``--semantics``, ...), one home for
the CLI (:mod:`schedsim.cli.common`) and the Python API (:func:`schedsim.api.scenario`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from schedsim.errors import ScenarioError

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario


def parse_value(text: str) -> Any:
    """A parameter value written as text: ``true``/``false``, an int, a float, or the
    text itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def key_values(items: Sequence[str] | dict[str, Any] | None, flag: str,
               hint: str = "") -> dict[str, Any]:
    """``KEY=VALUE`` items (or a dict) as a dict: keys with ``-`` read as ``_``, values as
    bool, int, float or text. Raises :class:`ScenarioError` naming ``flag`` (and
    ``hint``) for an item without ``=``."""
    if isinstance(items, dict):
        return {k.replace("-", "_"): v for k, v in items.items()}
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ScenarioError(f"bad {flag} {item!r}: expected KEY=VALUE{hint}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = parse_value(v.strip())
    return out


@dataclass(frozen=True)
class ScenarioFlags:
    """The values the command line's scenario flags set, None where not given: the
    ``[schedule]`` source and size (``schedule`` is its ``name``; ``param``: KEY=VALUE
    items or a dict; ``program``/``schedule_file`` replace the file's schedule source),
    ``cost`` (the ``--cost`` text), the ``[comm]`` settings (``eager_threshold`` is
    ``eager_threshold_bytes``) and the ``[link]`` and message size. ``mem_limit``: a
    number (microbatches' activations) or a size text (``"76GiB"``: bytes per GPU, which
    the scenario's ``[workload]`` converts: :func:`schedsim.workload.table.size_mem_limit`)."""

    schedule: str | None = None
    ranks: int | None = None
    microbatches: int | None = None
    chunks: int | None = None
    variant: str | None = None
    mem_limit: float | str | None = None
    param: Sequence[str] | dict[str, Any] | None = None
    cost: str | None = None
    semantics: str | None = None
    comm_stream: str | None = None
    eager_threshold: float | str | None = None
    launch_cost: float | None = None
    lazy_init: bool | None = None
    init_cost: float | None = None
    connections: int | None = None
    group_semantics: str | None = None
    message_bytes: float | str | None = None
    latency: float | None = None
    bandwidth: float | None = None
    comm_policy: str | None = None
    program: Path | None = None
    schedule_file: Path | None = None
    stages: int | None = None
    placement: str | None = None


#: [schedule] key of each schedule flag (``program``/``schedule_file``: resolved paths)
_SCHEDULE_KEYS = {"schedule": "name", "ranks": "ranks", "microbatches": "microbatches",
                  "chunks": "chunks", "variant": "variant", "mem_limit": "mem_limit",
                  "comm_policy": "comm_policy", "stages": "stages",
                  "placement": "placement", "program": "program",
                  "schedule_file": "schedule_file"}
#: [comm] key of each comm flag
_COMM_KEYS = {"semantics": "semantics", "comm_stream": "comm_stream",
              "eager_threshold": "eager_threshold_bytes", "launch_cost": "launch_cost",
              "lazy_init": "lazy_init", "init_cost": "init_cost",
              "connections": "connections", "group_semantics": "group_semantics"}
#: [link] and [costs] key of each link flag and the message size flag
_LINK_KEYS = {"latency": "latency", "bandwidth": "bandwidth"}
_COSTS_KEYS = {"message_bytes": "message_bytes"}


def build_scenario(scenario: Path | None = None, flags: ScenarioFlags | None = None,
                   **values: Any) -> Scenario:
    """A :class:`Scenario` from a TOML file (optional) with the CLI flags' values applied
    on top: ``flags`` and/or its fields as keywords (these win; TypeError for a keyword
    :class:`ScenarioFlags` does not have).

    Raises :class:`~schedsim.errors.ScenarioError` for bad values.
    """
    from schedsim.scenario import load_scenario, parse_scenario
    from schedsim.sim.costs import parse_cost_string

    f = replace(flags or ScenarioFlags(), **values)
    _one_schedule_source(f)
    check_choices(semantics=f.semantics, comm_stream=f.comm_stream, placement=f.placement,
                   group_semantics=f.group_semantics)
    if scenario is not None:
        sc = load_scenario(scenario)
        # exclude_unset: what the file did not set stays unset, so that the cost warnings
        # (schedsim.report.advice) know which costs the user gave
        data = sc.model_dump(exclude={"base_dir"}, exclude_none=True, exclude_unset=True)
        base = sc.base_dir
    else:
        data, base = {}, "."
    sched = data.setdefault("schedule", {})
    if f.program is not None or f.schedule_file is not None:
        for k in ("name", "program", "schedule_file"):
            sched.pop(k, None)
    f = replace(f, mem_limit=_mem_limit(f.mem_limit),
                message_bytes=byte_count(f.message_bytes, "message_bytes"),
                eager_threshold=byte_count(f.eager_threshold, "eager_threshold"))
    for flag, key in _SCHEDULE_KEYS.items():
        v = getattr(f, flag)
        if v is not None:
            sched[key] = str(Path(v).resolve()) if flag in ("program", "schedule_file") else v
    params = key_values(f.param, "--param")
    sched.update(params)
    _no_foreign_keys(sched)
    # a refused value a flag set names the flag (FlagError), not the [table] key
    flags_set = {(table, key): flag for table, keys in (("schedule", _SCHEDULE_KEYS),
                                                        ("comm", _COMM_KEYS),
                                                        ("link", _LINK_KEYS),
                                                        ("costs", _COSTS_KEYS))
                 for flag, key in keys.items() if getattr(f, flag) is not None}
    flags_set.update({("schedule", k): "param" for k in params})
    source = str(scenario) if scenario else "command line"
    if f.cost is not None:   # on top of the costs the rest gives (read as below: same errors)
        base_costs = parse_scenario(data, source, base, flags_set).costs
        data["costs"] = parse_cost_string(f.cost, base_costs).model_dump(exclude_unset=True)
    comm = data.setdefault("comm", {})
    for flag, key in _COMM_KEYS.items():
        if getattr(f, flag) is not None:
            comm[key] = getattr(f, flag)
    if f.message_bytes is not None:
        data.setdefault("costs", {})["message_bytes"] = f.message_bytes
    link = data.setdefault("link", {})
    if f.latency is not None:
        link["latency"] = f.latency
    if f.bandwidth is not None:
        link["bandwidth"] = f.bandwidth
    return parse_scenario(data, source, base, flags_set,
                          file=str(scenario) if scenario is not None else None)


#: the flags that each give the schedule, as the user types them
_SOURCE_FLAGS = {"schedule": "-s/--schedule", "program": "--program",
                 "schedule_file": "--schedule-file"}


def _one_schedule_source(f: ScenarioFlags) -> None:
    """Refuse (:class:`~schedsim.errors.ScenarioError`) two flags that each give the
    schedule (``-s 1f1b --program p.txt``), naming both and which to drop for either
    meaning; a scenario file's own source is replaced by a flag's, so only flags clash."""
    given = [k for k in _SOURCE_FLAGS if getattr(f, k) is not None]
    if len(given) < 2:
        return
    a, b = (_SOURCE_FLAGS[k] for k in given[:2])
    what = {"schedule": f"generate {f.schedule!r}", "program": "run the program text",
            "schedule_file": "run the schedule file"}
    raise ScenarioError(f"{a} and {b} both give the schedule: drop {b} to "
                        f"{what[given[0]]}, or {a} to {what[given[1]]}")


def byte_count(value: float | str | None, flag: str) -> float | None:
    """A byte-count flag's value (``--message-bytes``, ``--eager-threshold``): a bare
    number is bytes (its bounds are the scenario's: a negative one is refused there,
    naming the flag), a size with a unit (``1MiB``, ``4MB``) its bytes, through the one
    parser of sizes (:func:`schedsim.util.units.parse_size`). Raises
    :class:`~schedsim.errors.FlagError` naming ``flag`` for anything else."""
    if value is None:
        return None
    from schedsim.errors import FlagError
    from schedsim.util.units import parse_size

    try:
        return parse_size(value, "size")[0]
    except ScenarioError as e:
        raise FlagError(flag, str(e)) from None


def _mem_limit(value: float | str | None) -> float | str | None:
    """``--mem-limit`` as ``[schedule] mem_limit`` takes it: a bare number as a float
    (microbatches' activations, as before), a size with a unit as its text (converted
    against the workload when the scenario is read). Raises
    :class:`~schedsim.errors.FlagError` for neither (:func:`schedsim.util.units.parse_size`)."""
    if value is None:
        return None
    from schedsim.errors import FlagError
    from schedsim.util.units import parse_size

    try:
        number, is_bytes = parse_size(value, "size")
    except ScenarioError as e:
        raise FlagError("mem_limit", str(e)) from None
    return str(value).strip() if is_bytes else number


def check_choices(**flags: str | None) -> None:
    """Refuse (:class:`ScenarioError`) a flag value outside its choices (``semantics``,
    ``comm_stream``, ``placement``, ``group_semantics``; ``semantics = "all"`` passes),
    with a typo suggestion."""
    from schedsim.program.ir import PLACEMENTS
    from schedsim.program.vocab import COMM_STREAMS, GROUP_SEMANTICS, SEMANTICS
    from schedsim.util.suggest import did_you_mean

    choices = {"semantics": SEMANTICS, "comm_stream": COMM_STREAMS, "placement": PLACEMENTS,
               "group_semantics": GROUP_SEMANTICS}
    for name, value in flags.items():
        ok = choices[name]
        if value is not None and value.replace("_", "-") not in ok \
                and not (name == "semantics" and value == "all"):
            from schedsim.errors import ScenarioError

            raise ScenarioError(f"unknown --{name.replace('_', '-')} {value!r}"
                                f"{did_you_mean(value, ok)}: expected one of "
                                f"{', '.join(ok)}")


def _no_foreign_keys(sched: dict[str, Any]) -> None:
    """Refuse a [schedule] key (or --param) that is another tool's name for a schedsim
    setting (``num_microbatches``), naming schedsim's."""
    from schedsim.generators import foreign_key_hint

    for k in sched:
        hint = foreign_key_hint(k)
        if hint is not None:
            raise ScenarioError(f"[schedule] {hint}")
