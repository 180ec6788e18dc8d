"""Scenario files (TOML): which schedule, its costs, the links and the comm semantics.

Example (``schedules/dualpipe-figure.toml``)::

    title = "DualPipe README figure"

    [schedule]
    name = "dualpipe"          # any name from `schedsim list`
    ranks = 8
    microbatches = 20
    # generator parameters go here too (chunks = 2, variant = "megatron", ...);
    # comm_policy = "async" lowers compute-only schedules (async | commit | torch |
    # megatron), and that policy's parameters go here too (batch_p2p_comm = false, ...);
    # program = "file.txt" (with placement/stages) or schedule_file = "x.json|x.csv"
    # load a hand-written program or schedule instead of a generator. A torch CSV with
    # SEND/RECV cells runs with those comms unless comm_policy is set.

    [costs]                    # schedsim.sim.costs.CostModel
    F = 1
    B = 1
    W = 1
    BW = 2
    FB = 3
    # [costs.stage.3] F = 2    per-stage override;  [[costs.overrides]] per (stage, mb)
    # message_bytes = 1e6      bytes per message; [costs.stage_bytes] per stage

    [link]                     # schedsim.sim.costs.LinkModel
    latency = 0
    # bandwidth = 1e9          bytes per time unit;  [[link.links]] src/dst overrides

    [model]                    # optional: schedsim.sim.stage_model.StageModel
    # layers = 4, tp = 4, moe = true, ep = 8, overlap = "fb", ...: derives F, B, W, BW,
    # FB (and message_bytes) from the layers and their TP/EP collectives; a kind typed
    # in [costs] still wins (docs/stage-model.md)

    [workload]                 # optional: a model on GPUs (docs/workload.md): costs in ms,
    # model = "llama3.1-70b", gpu = "h100-sxm", seq = 8192, tp = 8, pp = 4, ...: links, bytes

    [comm]                     # schedsim.sim.costs.CommModel
    semantics = "data"         # data | eager | rendezvous
    comm_stream = "none"       # none | per-peer | per-rank
    # eager_threshold_bytes = 65536
    # launch_cost = 0.2        host time per launched batch of sends/recvs
    # lazy_init = true         NCCL's lazy 2-rank communicator init (docs/comm-semantics.md)
    # init_cost = 5            its cost, in the cost unit
    # group_semantics = "atomic"   NCCL groups: a BATCH moves when all its ops are matched

Relative paths are resolved against the scenario file's folder. Every unknown key is an
error that names it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from schedsim.errors import ScenarioError, ScheduleError, SchedsimError, file_message, in_file
from schedsim.program.ir import Placement, Program
from schedsim.program.text_file import load_program_file, program_from_rows  # noqa: F401
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.program.stage_graph import StageGraph, shape_program
from schedsim.scenario_schedule import ScheduleSection
from schedsim.sim.stage_model import StageModel

if TYPE_CHECKING:   # for annotations; imported where used (no [model]: no overlap scheduler)
    from schedsim.sim.stage_costs import StageCosts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Scenario(BaseModel):
    """A whole scenario: schedule + costs + links + comm semantics."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    title: str = ""
    description: str = ""
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    costs: CostModel = Field(default_factory=CostModel)
    link: LinkModel = Field(default_factory=LinkModel)
    comm: CommModel = Field(default_factory=CommModel)
    memory: dict[str, Any] = Field(default_factory=dict)
    replay: dict[str, Any] = Field(default_factory=dict)
    model: StageModel | None = None
    workload: dict[str, Any] | None = None
    stages: StageGraph | None = None
    base_dir: str = Field(default=".", exclude=True)
    _workload: Any = PrivateAttr(default=None)
    #: ``[schedule] mem_limit`` given as a size, in microbatches' worth (None: as given)
    _mem_limit: float | None = PrivateAttr(default=None)
    #: with it, the planners' F,B,W deltas and one limit per rank of the workload's bytes
    #: (:func:`schedsim.workload.table.planner_memory`; None for a number)
    _mem_deltas: tuple[float, float, float] | None = PrivateAttr(default=None)
    _mem_per_rank: tuple[float, ...] | None = PrivateAttr(default=None)
    #: the scenario file it was read from (None: flags or a dict alone)
    _file: str | None = PrivateAttr(default=None)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: dict[str, Any]) -> dict[str, Any]:
        """``[memory]`` is checked now (finite numbers, known keys), not when first used."""
        from schedsim.analysis.memory import MemoryModel

        if v:
            MemoryModel.from_spec(v)
        return v

    @field_validator("model")
    @classmethod
    def _model_size(cls, v: StageModel | None) -> StageModel | None:
        """A stage whose layers alone exceed the work limit is refused at once (its costs
        loop over every layer); :meth:`build_program` then bounds all stages together."""
        if v is not None:
            Scenario._check_model_size_of(v, 1)
        return v

    @model_validator(mode="after")
    def _derive_costs(self, info: ValidationInfo) -> "Scenario":
        """With a ``[model]`` (or a ``[workload]``: :mod:`schedsim.workload.table`), the
        kinds ``[costs]`` leaves untyped come from it. ``[schedule]``'s keys are checked
        first (:meth:`ScheduleSection.check_keys`)."""
        flags = (info.context or {}).get("flags") if info is not None else None
        self.schedule.check_keys(flags)
        if self.workload is not None:
            from schedsim.workload.table import apply_workload

            self._workload = apply_workload(self, flags)
        elif self.model is not None:
            from schedsim.sim.stage_costs import StageCosts

            self.costs = self.costs.with_derived(StageCosts(self.model, self.comm.connections),
                                                 self.model.message_bytes())
        if isinstance((self.schedule.model_extra or {}).get("mem_limit"), str):
            from schedsim.workload.table import size_mem_limit

            pm = size_mem_limit(self, flags)
            if pm is not None:
                self._mem_limit, self._mem_deltas, self._mem_per_rank = pm
        return self

    def workload_model(self) -> Any:
        """The checked :class:`~schedsim.workload.layout.Workload` (None without one)."""
        return self._workload

    def derived_workload(self, placement: Placement) -> Any:
        """:func:`schedsim.workload.table.derive_scenario` (None without a workload)."""
        if self._workload is None:
            return None
        from schedsim.workload.table import derive_scenario

        return derive_scenario(self, placement)

    def stage_costs(self) -> StageCosts | None:
        """The derived costs of ``[model]`` (None without one)."""
        d = self.costs._derived
        if d is None:
            return None
        from schedsim.sim.stage_costs import StageCosts

        return d if isinstance(d, StageCosts) else None

    def resolve(self, path: str) -> Path:
        if "\x00" in path:
            raise ScenarioError(f"[schedule] path {path[:60]!r}... has a NUL byte")
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    @property
    def source_file(self) -> str | None:
        """The scenario file this was read from (None: from flags or a dict alone)."""
        return self._file

    def build_program(self) -> Program:
        """The program this scenario runs (generated, or loaded from its file), validated
        (:func:`~schedsim.program.validate.validate_schedule` on its compute order, unless a
        registered generator built it) and checked
        against the scenario (every stage, microbatch and rank the scenario names exists).

        Raises :class:`SchedsimError` subclasses for anything missing or invalid; a
        scenario or schedule error of a scenario read from a file starts with the file's
        name, as its reading's errors do (:func:`in_file`).
        """
        try:
            return self._build_checked()
        except (ScenarioError, ScheduleError) as e:
            raise in_file(e, self._file) from None

    def _build_checked(self) -> Program:
        from schedsim.program.validate import validate_all

        s = self.schedule
        sources = [k for k, v in (("name", s.name), ("program", s.program),
                                  ("schedule_file", s.schedule_file)) if v]
        if len(sources) > 1:
            raise ScenarioError(f"[schedule] sets {' and '.join(sources)}: give one of a "
                                f"generator name, a program file or a schedule file")
        if s.name and (s.placement or s.stages):
            raise ScenarioError(f"[schedule] {s.name}: placement and stages are fixed by the "
                                f"generator; they apply to a program or schedule file only")
        prog = self._build_program()
        prog = shape_program(prog, self.stages, s)      # [stages] edges, max_batch_ops
        # every rule, over the arrays first (the per-op validator words the first error);
        # a registered generator's output is validated already (proven by its tests)
        prog = validate_all(prog)
        self.check_references(prog)
        self._check_model_size(prog.placement.stages)
        return prog

    def _check_model_size(self, stages: int) -> None:
        """Bound the stage model's work before it is done: its costs and pieces loop over
        every layer of every stage (``[model] layers = 99999999`` ran for minutes), about
        :data:`PIECES_PER_LAYER` pieces each, counted against the ``instructions``
        limit."""
        if self.model is not None:
            self._check_model_size_of(self.model, stages)

    @staticmethod
    def _check_model_size_of(m: StageModel, stages: int) -> None:
        from schedsim.util.limits import check

        layers = max([m.layers] + [o.layers for o in m.stage.values() if o.layers])
        n = PIECES_PER_LAYER * layers * stages
        check("instructions", n, f"the [model] of {layers:,} layers per stage on {stages:,} "
                                 f"stage{'s' if stages > 1 else ''}: about {n:,} pieces of "
                                 f"work")

    def check_references(self, prog: Program) -> None:
        """Every stage, microbatch and rank named in ``[costs]``/``[link]`` exists in
        ``prog``. Raises :class:`ScenarioError` naming the key."""
        from schedsim.util.text import clip

        S, M, P = prog.placement.stages, prog.microbatches, prog.placement.ranks
        for st in self.costs.stage:
            if not 0 <= st < S:
                raise ScenarioError(f"[costs.stage.{clip(str(st), 20)}]: the program has "
                                    f"stages 0..{S - 1}")
        for st in self.costs.stage_bytes:
            if not 0 <= st < S:
                raise ScenarioError(f"[costs.stage_bytes] {clip(str(st), 20)}: the program "
                                    f"has stages 0..{S - 1}")
        for o in self.costs.overrides:
            if not (0 <= o.stage < S and 0 <= o.mb < M):
                raise ScenarioError(f"[[costs.overrides]] stage {clip(str(o.stage), 20)} mb "
                                    f"{clip(str(o.mb), 20)}: the "
                                    f"program has stages 0..{S - 1} and microbatches "
                                    f"0..{M - 1}")
        for st in (self.model.stage if self.model is not None else ()):
            if not 0 <= st < S:
                raise ScenarioError(f"[model.stage.{clip(str(st), 20)}]: the program has "
                                    f"stages 0..{S - 1}")
        for lk in self.link.links:
            if not (lk.src < P and lk.dst < P) or lk.src == lk.dst:
                raise ScenarioError(f"[[link.links]] src {clip(str(lk.src), 20)} dst "
                                    f"{clip(str(lk.dst), 20)}: need two "
                                    f"different ranks in 0..{P - 1}")

    def _build_program(self) -> Program:
        s = self.schedule
        if s.program:
            return load_program_file(self.resolve(s.program), s.placement,
                                     ranks=s.ranks, stages=s.stages,
                                     microbatches=s.microbatches,
                                     comm_policy=s.comm_policy,
                                     policy_params=s.generator_params())
        if s.schedule_file:
            path = self.resolve(s.schedule_file)
            if path.suffix.lower() == ".csv" and s.comm_policy is None:
                # a compute+comms torch CSV runs with its own SEND/RECV order
                from schedsim.interop.torch_format import read_torch_csv_program

                prog = read_torch_csv_program(path, s.placement or "loop", stages=s.stages,
                                              microbatches=s.microbatches)
                if prog is not None:
                    _no_policy_params(s.generator_params(), path)
                    return prog
            from schedsim.interop.schedule_files import load_schedule_file
            from schedsim.program.lower import lower

            sched = load_schedule_file(self.resolve(s.schedule_file), placement=s.placement,
                                       stages=s.stages, microbatches=s.microbatches)
            return lower(sched, s.comm_policy or "async", **s.generator_params())
        if not s.name:
            raise ScenarioError("[schedule] needs a name (see 'schedsim list'), a program "
                                "file or a schedule_file")
        if s.ranks is None or s.microbatches is None:
            raise ScenarioError(f"[schedule] {s.name}: set ranks and microbatches")
        from schedsim.generators import build_program, generated_stages, get as get_generator

        params = s.generator_params()
        gen = get_generator(s.name)
        if self._mem_limit is not None:         # a size, in microbatches' worth
            params["mem_limit"] = self._mem_limit
            # with one limit per rank and the deltas of the workload's bytes in the same
            # unit (a mem_deltas the [schedule] sets wins): workload.table.planner_memory
            if self._mem_deltas is not None and "mem_deltas" in gen.accepted():
                params.setdefault("mem_deltas", list(self._mem_deltas))
                params["mem_limit"] = list(self._mem_per_rank or ()) or self._mem_limit
        if self._workload is not None:          # the [workload]'s chunks
            from schedsim.workload.table import workload_params

            params = workload_params(self.workload or {}, gen, params, self._workload)
        from schedsim.util.limits import check_program_size

        check_program_size(s.name, ranks=s.ranks, microbatches=s.microbatches,
                           stages=generated_stages(gen, s.ranks, params))
        # planners whose order depends on the costs (zb-1p, zb-2p, zbv) take the
        # scenario's cost and link models as the `costs` / `link` parameters
        takes = gen.accepted()
        if "costs" in takes:
            params.setdefault("costs", self.costs)
        if "link" in takes:
            params.setdefault("link", self.link)
        try:
            return build_program(s.name, s.ranks, s.microbatches, s.comm_policy, **params)
        except ScheduleError as e:      # the sizes are the [workload]'s: name its settings
            if self._workload is not None:
                from schedsim.workload.table import schedule_sizes_hint

                hint = schedule_sizes_hint(self._workload, s.name, params)
                if hint is not None:
                    e.args = (f"{e}; {hint}",)
            raise


def simulate_scenario(prog: Program, sc: Any, comm: CommModel | None = None
                      ) -> tuple[Any, Any]:
    """Simulate ``prog`` with the scenario ``sc``'s models (deadlocks returned, not
    raised): ``(timeline, result)``, with a ``[workload]`` the result its
    :class:`~schedsim.workload.run.WorkloadResult` (None without one or on a deadlock),
    whose summary the timeline carries as its ``workload`` object. What ``simulate``
    runs, and ``compare`` of a workload for each schedule
    (:func:`schedsim.sweep_workload.compare_workload_schedules`)."""
    from schedsim.sim.simulate import simulate_run

    tl, cp, st = simulate_run(prog, sc.costs, sc.link, comm or sc.comm,
                              raise_on_deadlock=False)
    d = sc.derived_workload(prog.placement)
    if d is None or tl.deadlock is not None:
        return tl, None
    from schedsim.workload.run import result_of

    return tl, result_of(d, tl, cp, st)


#: pieces of work per layer of the stage model (attention and MLP, F/B/W, collectives)
PIECES_PER_LAYER = 8


def _no_policy_params(params: dict[str, Any], path: Path) -> None:
    """A file that brings its own sends and recvs is not lowered: refuse comm policy
    parameters for it rather than ignore them (ScenarioError naming them)."""
    if params:
        raise ScenarioError(f"{path.name} has its own sends/recvs, so no comm policy lowers "
                            f"it and {', '.join(sorted(params))} would do nothing: drop "
                            f"them, or add --comm-policy to re-lower its compute order")


def parse_scenario(data: dict[str, Any], source: str = "scenario",
                   base_dir: str = ".", flags: dict[tuple[str, str], str] | None = None,
                   file: str | None = None) -> Scenario:
    """Validate a scenario dict in pydantic's strict mode: a quoted number or a boolean
    where a number goes (``F = "1"``, ``F = true``, ``ranks = "2"``) is refused with the
    type expected and the one given, as the trace loader already did. ``flags``: the
    keys a command-line flag set, ``(table, key)`` -> the flag's field name. Raises
    :class:`ScenarioError` naming the bad key (a :class:`~schedsim.errors.FlagError`
    naming the flag when a flag set it). ``file``: the scenario file the data was read
    from (:attr:`Scenario.source_file`: :meth:`Scenario.build_program`'s errors name it)."""
    from schedsim.errors import FlagError, Stopped
    from schedsim.scenario_keys import format_validation, index_keys
    from schedsim.util.validation import error_text

    try:    # (the first validation also builds the models' schemas: defer_build)
        sc = Scenario.model_validate({**index_keys(data), "base_dir": base_dir},
                                     strict=True, context={"flags": flags or {}})
    except ValidationError as e:
        err = e.errors()[0]
        flag = (flags or {}).get(tuple(str(x) for x in err["loc"][:2]))
        if flag is not None and len(err["loc"]) == 2:
            raise FlagError(flag, error_text(err)) from None
        raise ScenarioError(format_validation(e, source, Scenario)) from None
    except (Stopped, FlagError):
        raise           # a stop signal is the user's; a flag's value names the flag
    except SchedsimError as e:
        raise ScenarioError(file_message(source, str(e))) from None
    sc._file = file
    return sc


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file. Raises :class:`ScenarioError`."""
    from schedsim.util.inputs import loading, read_input_text

    path = Path(path)
    with loading(path, "scenario TOML"):
        text = read_input_text(path, "scenario file")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            if text.lstrip().startswith("{"):       # a Timeline or schedule JSON
                raise ScenarioError(f"{path}: a JSON file, not a scenario TOML (a Timeline "
                                    f"JSON goes to render, report, stalls, align, "
                                    f"critical-path, memory; a JSON schedule to "
                                    f"--schedule-file)") from None
            if _is_program_text(text):
                raise ScenarioError(f"{path}: a program text file, not a scenario TOML: "
                                    f"give it as --program {path}") from None
            raise ScenarioError(f"{path}: malformed TOML: {e}") from None
        return parse_scenario(data, str(path), str(path.parent), file=str(path))


def _is_program_text(text: str) -> bool:
    """True if ``text``'s first line that is neither blank nor a ``#`` comment reads
    ``rank N: ...`` (the program text parser's own pattern), as program text (``schedsim generate``'s default format) begins."""
    from schedsim.program.tokens import _RANK

    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return _RANK.match(line) is not None
    return False


def apply_costs_file(scenario: Scenario, path: str | Path) -> Scenario:
    """``scenario`` with its ``[costs]`` and ``[link]`` replaced by those of a cost file
    (a TOML fragment such as ``schedsim calibrate`` writes; a table the file lacks is
    kept) and, if the file has a ``[comm]`` table, its ``launch_cost`` (host time per
    launched batch, in the cost unit) and ``host`` (measured host times, from ``schedsim
    calibrate --exact``); the scenario's comm semantics and streams are kept.

    Raises :class:`ScenarioError` for a missing or malformed file, a file with none of
    these tables, another table, or a ``[comm]`` key other than ``launch_cost`` (named).
    """
    from schedsim.util.inputs import loading, read_input_text

    path = Path(path)
    with loading(path, "cost file"):
        try:
            data = tomllib.loads(read_input_text(path, "cost file"))
        except tomllib.TOMLDecodeError as e:
            raise ScenarioError(f"{path}: malformed TOML: {e}") from None
        return _with_costs(scenario, data, path)


def _with_costs(scenario: Scenario, data: dict[str, Any], path: Path) -> Scenario:
    from schedsim.util.text import clip

    extra = sorted(set(data) - {"costs", "link", "comm"})
    if extra or not data:
        raise ScenarioError(f"{path}: a cost file holds only [costs], [link] and [comm] "
                            f"tables (got {', '.join(map(clip, extra)) or 'nothing'})")
    merged = scenario.model_dump(exclude={"base_dir"}, exclude_none=True, exclude_unset=True)
    comm = data.pop("comm", None)
    if comm is not None:
        if not isinstance(comm, dict):
            raise ScenarioError(f"{path}: 'comm' must be a table ([comm] with launch_cost)")
        bad = sorted(set(comm) - {"launch_cost", "host", "host_cost"})
        if bad:
            raise ScenarioError(f"{path}: [comm] of a cost file holds only launch_cost, "
                                f"host_cost and host (got {', '.join(map(clip, bad))}; set "
                                f"semantics and streams with --semantics / --comm-stream)")
        merged["comm"] = {**merged.get("comm", {}), **comm}
    merged.update(data)
    return parse_scenario(merged, str(path), scenario.base_dir, file=scenario.source_file)
