"""Replay settings (the scenario's ``[replay]`` table), the job spec handed to each rank,
and the replay's error type. Imports without torch.

``[replay]`` keys (all optional)::

    workload = "mlp"          # mlp | transformer
    hidden = 64               # hidden size
    layers_per_stage = 2      # blocks per stage (model chunk)
    seq = 16                  # sequence length
    microbatch_size = 2       # samples per microbatch
    heads = 4                 # attention heads (transformer)
    ffn_mult = 4              # MLP inner size = ffn_mult x hidden
    dtype = "float32"         # float32 | float64
    seed = 0                  # parameter init and data
    backend = "gloo"          # gloo (CPU) | nccl (one GPU per rank)
    device = "auto"           # auto (nccl: cuda, gloo: cpu) | cpu | cuda (with gloo: the
                              # ranks share the GPUs, P2P staged through host memory)
    timeout = 120             # seconds for the whole run, process start included
    warmup = 1                # untimed steps before the measured steps
    steps = 5                 # measured steps; the one with the median makespan is kept
    threads = 1               # torch threads per rank
    tp = 1                    # tensor-parallel size: pp x tp processes
    tp_comm = "megatron-fg"   # megatron-fg (f/g autograd functions) | domino

With ``tp > 1`` every stage is tensor-parallel (:mod:`schedsim.replay.tensor_parallel`):
process ``pp_rank * tp + tp_rank`` runs TP rank ``tp_rank`` of pipeline rank ``pp_rank``.

Activations and gradients crossing a stage boundary have shape
``(microbatch_size, seq, hidden)``.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schedsim.errors import ScenarioError, SchedsimError
from schedsim.util.text import clip


class ReplayError(SchedsimError):
    """A replay failed at run time: a rank raised or timed out, or the gradient check
    failed. Exit code 1 from the CLI (2 stays "bad input")."""

    exit_code = 1


def require_torch() -> None:
    """Raise :class:`ScenarioError` with the install command when torch is missing."""
    if importlib.util.find_spec("torch") is None:
        from schedsim.util.install import install_hint

        raise ScenarioError("the replay needs torch, which is not installed: "
                            + install_hint("replay", "torch"))


def require_gpus(n: int, python: str | None = None) -> None:
    """Raise :class:`ScenarioError` unless this machine has ``n`` CUDA GPUs (nccl: one per
    rank), before any rank starts. Asked in a child process (``torch.cuda.device_count()``;
    the launcher itself does not import torch)."""
    import subprocess
    import sys

    try:
        out = subprocess.run([python or sys.executable, "-c", "import torch; "
                              "print(torch.cuda.device_count())"], capture_output=True,
                             text=True, timeout=120)
        have = int(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        have = 0
    if have < n:
        raise ScenarioError(f"--backend nccl runs one rank per CUDA GPU: {n} needed, this "
                            f"machine has {have} (torch.cuda.device_count()); use --backend "
                            f"gloo")


class ReplayConfig(BaseModel):
    """The workload and run settings of a replay (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    workload: Literal["mlp", "transformer"] = "mlp"
    hidden: int = Field(default=64, ge=1)
    layers_per_stage: int = Field(default=2, ge=1)
    seq: int = Field(default=16, ge=1)
    microbatch_size: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    ffn_mult: int = Field(default=4, ge=1)
    dtype: Literal["float32", "float64"] = "float32"
    seed: int = 0
    backend: Literal["gloo", "nccl"] = "gloo"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout: float = Field(default=120.0, gt=0)
    warmup: int = Field(default=1, ge=0)
    steps: int = Field(default=5, ge=1)
    threads: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    tp_comm: Literal["megatron-fg", "domino"] = "megatron-fg"

    @property
    def device_type(self) -> str:
        """``cuda`` or ``cpu``: where the stages compute (``auto``: cuda for nccl)."""
        if self.device == "auto":
            return "cuda" if self.backend == "nccl" else "cpu"
        return self.device

    @model_validator(mode="after")
    def _check(self) -> "ReplayConfig":
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("backend nccl computes on GPUs: use device = \"cuda\" (or "
                             "\"auto\"), or backend gloo for the CPU")
        if self.workload == "transformer" and self.hidden % self.heads:
            raise ValueError(f"transformer: hidden ({self.hidden}) must be a multiple of "
                             f"heads ({self.heads})")
        if self.tp > 1:
            if (self.ffn_mult * self.hidden) % self.tp:
                raise ValueError(f"tp = {self.tp} must divide the MLP size ffn_mult x hidden "
                                 f"= {self.ffn_mult * self.hidden}")
            if self.workload == "transformer" and self.heads % self.tp:
                raise ValueError(f"tp = {self.tp} must divide heads ({self.heads}): "
                                 f"attention is split by heads")
            if self.tp_comm == "domino" and self.microbatch_size % 2:
                raise ValueError(f"tp_comm = domino splits a microbatch in two halves: "
                                 f"microbatch_size ({self.microbatch_size}) must be even")
        return self

    @property
    def activation_shape(self) -> tuple[int, int, int]:
        """Shape of every boundary tensor: ``(microbatch_size, seq, hidden)``."""
        return (self.microbatch_size, self.seq, self.hidden)

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    @property
    def message_bytes(self) -> int:
        """Bytes of one activation or gradient message."""
        b, s, h = self.activation_shape
        return b * s * h * self.itemsize

    @classmethod
    def from_table(cls, table: dict[str, Any], source: str = "[replay]",
                   **overrides: Any) -> "ReplayConfig":
        """Validate a ``[replay]`` table with CLI ``overrides`` (None = keep) on top.

        Raises :class:`ScenarioError` naming the bad key.
        """
        data = dict(table)
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = clip(".".join(str(x) for x in err["loc"])) or "[replay]"
            if err["type"] == "extra_forbidden":
                msg = (f"unknown key '{loc}' (expected one of "
                       f"{', '.join(cls.model_fields)})")
            elif not err["loc"]:          # a whole-table rule (model validator)
                msg = str(err["msg"]).removeprefix("Value error, ")
            else:
                msg = f"'{loc}': {err['msg']}"
            raise ScenarioError(f"{source}: {msg}") from None


class Fault(BaseModel):
    """A fault to inject (testing aid): rank ``rank`` raises (or hangs) when it reaches
    instruction ``index`` of the measured step."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    rank: int = Field(ge=0)
    index: int = Field(default=0, ge=0)
    kind: Literal["raise", "hang"] = "raise"

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """``RANK[:INDEX[:raise|hang]]`` -> Fault. Raises :class:`ScenarioError`."""
        parts = text.split(":")
        try:
            if not 1 <= len(parts) <= 3:
                raise ValueError
            kw: dict[str, Any] = {"rank": int(parts[0])}
            if len(parts) > 1:
                kw["index"] = int(parts[1])
            if len(parts) > 2:
                kw["kind"] = parts[2]
            return cls(**kw)
        except (ValueError, ValidationError):
            raise ScenarioError(f"bad --inject-fault {text!r}: expected RANK[:INDEX[:raise|"
                                f"hang]], e.g. 1:5") from None


class JobSpec(BaseModel):
    """Everything a rank needs: the program, the workload and what to do.

    ``program`` is the :class:`~schedsim.program.ir.Program` JSON. ``deadline`` is a wall-clock
    ``time.time()`` by which every rank must be done (None: now + ``config.timeout`` when
    the rank starts). ``calibrate`` measures costs (and ``link`` ping-pong) before the
    replay; ``replay`` runs the measured step; ``out_dir`` receives ``result.json`` from
    rank 0 and ``error-rank{r}.json`` from a failing rank. ``task`` is what the processes
    run: the replay, or ``check-collectives`` (:mod:`schedsim.replay.collectives_check`,
    ``config.tp`` processes; ``program`` unused).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    program: dict[str, Any]
    config: ReplayConfig = Field(default_factory=ReplayConfig)
    check_grads: bool = False
    replay: bool = True
    calibrate: bool = False
    calib_repeats: int = Field(default=5, ge=1)
    #: measure op costs one rank at a time (uncontended) instead of all ranks together
    calib_isolated: bool = False
    #: calibrate by running ``calib_repeats`` steps of the program itself (contended:
    #: messages move while the ranks compute), fitted like a measured timeline
    #: (:mod:`schedsim.replay.contended`), instead of the op/ping-pong/launch benchmarks
    calib_contended: bool = False
    #: contended calibration without ``replay``: seconds of pause before each calibration
    #: step after the first (after its barrier), so that the steps sample the machine's
    #: speed over time (:mod:`schedsim.replay.contended`); 0: one after another
    calib_pause: float = Field(default=0.0, ge=0.0)
    calib_sizes: list[int] = Field(default_factory=lambda: [2 ** k for k in range(10, 23, 3)])
    clock: Literal["auto", "shared", "estimate"] = "auto"
    profile_dir: str | None = None
    fault: Fault | None = None
    deadline: float | None = None
    out_dir: str | None = None
    task: Literal["replay", "check-collectives"] = "replay"
    #: check-collectives on the user's operators: ``{"g": spec, "f": spec}`` (``f``
    #: optional), each ``MODULE:NAME`` or ``FILE.py:NAME``
    functions: dict[str, str] | None = None


#: what the pre-check tells the user about the comm semantics of the real backends
RENDEZVOUS_NOTE = ("gloo and NCCL sends behave like rendezvous: a send completes only once "
                   "the matching recv is posted")


def precheck_program(prog: Any) -> None:
    """Refuse a program the real backends would hang on, before any process starts.

    Simulates ``prog`` (unit costs) under ``rendezvous`` semantics, which is how gloo and
    NCCL point-to-point sends behave (measured: gloo hangs on ``schedules/crossed-sends``
    and on ``--comm-policy commit`` programs whose sends cross, even for 128-byte
    messages). Rendezvous completions are never earlier than eager ones, so this also
    refuses every program that deadlocks under eager semantics. Raises
    :class:`ScenarioError` (exit 2) carrying the simulator's wait-for chain, and
    :class:`~schedsim.errors.ProgramError` for an ill-formed program.
    """
    from schedsim.errors import DeadlockError
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate

    try:
        simulate(prog, comm=CommModel(semantics="rendezvous"))
    except DeadlockError as e:
        why = str(e)
        if why.startswith("deadlock: "):
            why = why[len("deadlock: "):]
        raise ScenarioError(
            f"refusing to replay {prog.name!r}: it deadlocks under rendezvous semantics "
            f"({RENDEZVOUS_NOTE}), so gloo/NCCL would hang until --timeout. Simulator: "
            f"{why} See 'schedsim lint' and 'schedsim simulate --semantics rendezvous "
            f"--gantt FILE.png'; pass --no-precheck to run it anyway (it then hangs until "
            f"--timeout)") from None


def check_fault(fault: Fault, prog: Any) -> None:
    """Raise :class:`ScenarioError` unless ``fault`` names a rank of ``prog`` and an
    instruction of that rank's program (``0 .. len(row)``, ``len(row)`` being the implicit
    ``END``)."""
    ranks = prog.placement.ranks
    if fault.rank >= ranks:
        raise ScenarioError(f"bad --inject-fault: rank {fault.rank} is out of range: the "
                            f"program has {ranks} ranks (0..{ranks - 1})")
    n = len(prog.ranks[fault.rank])
    if fault.index > n:
        raise ScenarioError(f"bad --inject-fault: instr {fault.index} is out of range: rank "
                            f"{fault.rank}'s program has instructions 0..{n - 1} and {n} = "
                            f"END")


def spec_from_scenario(scenario: Any, *, backend: str | None = None,
                       timeout: float | None = None, check_grads: bool = False,
                       precheck: bool = True, **fields: Any) -> JobSpec:
    """A :class:`JobSpec` for a :class:`~schedsim.scenario.Scenario`: its program, its
    ``[replay]`` table with ``backend``/``timeout`` overrides, and extra JobSpec
    ``fields``.

    Before any process starts the program goes through the compile step's checks
    (matching, producers, waits) and, when it will be run (``replay`` true) and
    ``precheck`` is true, :func:`precheck_program` (no rendezvous deadlock); an injected
    ``fault`` is checked against the program (:func:`check_fault`). Raises
    :class:`ScenarioError` / other :class:`SchedsimError`\\ s for a bad scenario.
    """
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate
    from schedsim.util.limits import check

    if scenario.schedule.ranks is not None:     # one process per rank: refuse before building
        check("procs", scenario.schedule.ranks, f"a replay on {scenario.schedule.ranks:,} "
                                                f"processes (one per rank)")
    cfg = ReplayConfig.from_table(scenario.replay, backend=backend, timeout=timeout)
    prog = scenario.build_program()
    check("procs", prog.placement.ranks, f"a replay of {prog.name!r} on "
                                         f"{prog.placement.ranks:,} processes (one per rank)")
    # every warmup and measured step runs the whole program: the replay's work
    runs, n = cfg.warmup + cfg.steps, prog.num_instructions()
    check("instructions", runs * n,
          f"a replay of {runs:,} steps (warmup {cfg.warmup:,} + steps {cfg.steps:,}) x "
          f"{n:,} instructions of {prog.name!r}")
    if precheck and fields.get("replay", True):
        precheck_program(prog)
    else:   # the compile step's checks only
        simulate(prog, comm=CommModel(semantics="eager"), raise_on_deadlock=False)
    if fields.get("fault") is not None:
        check_fault(fields["fault"], prog)
    if cfg.tp > 1 and fields.get("calibrate"):
        raise ScenarioError(f"calibration (calibrate, replay --compare) measures tp = 1 "
                            f"stages only; drop tp = {cfg.tp} (--set tp=1)")
    return JobSpec(program=prog.model_dump(mode="json"), config=cfg,
                   check_grads=check_grads, **fields)
