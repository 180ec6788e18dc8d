"""The workload of a training step: model, GPUs, batch, parallel degrees, sharding,
recompute, dtypes; the stage layout; and the rules a runnable configuration obeys.

:class:`Workload` is the ``[workload]`` table of a scenario and the Python object;
:meth:`Workload.check` refuses what Megatron-LM would refuse, one rule at a time, with a
:class:`WorkloadError` whose ``.rule`` names it (:data:`RULES`).

**Stages and layout.** The model is cut into ``pp x chunks`` stages (a stage is one
model chunk; stage ``s`` runs on the rank the schedule's placement gives it: ``s % pp``
for the loop placement of 1F1B and interleaved schedules, the V of ZB-V/DualPipeV, whose
last stage — the LM head — lands on rank 0 next to the embedding). ``layout`` says which
decoder layers each stage holds:

- ``None``: an even split (``num_hidden_layers`` must be a multiple of the stages), the
  embedding on the first stage, the LM head and loss on the last — Megatron-LM's default;
- a string in Megatron-LM's ``pipeline_model_parallel_layout`` syntax (``E`` embedding,
  ``t`` a decoder layer, ``L`` the final norm, LM head and loss, ``|`` between stages,
  ``x*n`` and ``(...)*n`` repeat; commas are cosmetic), e.g. ``"Et*3|(tt|)*29m|L"`` — from
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``
  (``PipelineParallelLayerLayout.parse_str_to_list``); its stages are listed in stage
  order (virtual stage ``v`` of rank ``r`` is stage ``v x pp + r``), as here. MTP layers
  (``m``) are not built;
- a list of decoder-layer counts per stage (the embedding on the first stage, the head on
  the last);
- ``"torchtitan"``: torchtitan's automatic split for any stage count (:func:`torchtitan_split`,
  ``torchtitan/parallelisms/pipelining_utils.py::generate_split_points`` @9dec370), so one
  workload serves a 1-stage-per-rank and a looped schedule alike.

Plain Python + pydantic.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schedsim.errors import ScenarioError
from schedsim.sim.stage_model import Overlap
from schedsim.workload.hardware import Dtype, Hardware, gpu_preset
from schedsim.workload.model import ModelConfig, load_model
from schedsim.workload.stage_split import (  # noqa: F401  (re-exported from their home)
    StageLayout, WorkloadError, _stage_layout, parse_layout, torchtitan_llm_split,
    torchtitan_split)

Recompute = Literal["none", "selective", "full"]

#: every rule :meth:`Workload.check` applies (``WorkloadError.rule``)
RULES = ("heads % tp", "kv_heads % tp", "experts % ep", "ep divides tp x dp",
         "layers fill pp x chunks stages", "global_batch_size % (micro_batch_size x dp)",
         "tp within a node", "gpus = tp x cp x dp x pp", "gpus % (tp x cp x pp)",
         "cp not built", "seq % tp",
         "layout", "gemm dtype on gpu", "moe needs ep", "sizes")

#: the largest sizes a training step has (a validation, not a work limit: above these a
#: workload is a typo, and its numbers overflow into nonsense — ``seq = 10**12`` gave a
#: makespan of 2e22 ms): 16 Mi tokens per sample, 16 Mi samples per (micro)batch, 1 Mi GPUs
MAX_SIZES = {"seq": 2 ** 24, "micro_batch_size": 2 ** 24, "global_batch_size": 2 ** 24,
             "num_gpus": 2 ** 20}


#: the unit of each [workload] figure that has one (for the messages of a figure out of
#: its range)
UNITS = {"overhead_ms": "ms"}
#: the per-op figures of a workload (each op's cost reads them), re-checked by
#: :meth:`Workload.check`: the fixed overhead per compute piece (0 to
#: :data:`MAX_OVERHEAD_MS`) and the two efficiencies (> 0 and <= 1)
FIGURES = ("overhead_ms", "efficiency", "comm_efficiency")
#: the largest ``overhead_ms`` (ms per compute piece; a validation, not a work limit): a
#: piece's fixed cost is kernel launches and dispatch, microseconds to about a
#: millisecond on real GPUs, so 1e6 ms (1,000 s an op) is far past any real value while
#: every sum of costs stays finite (10^7 ops x 1e6 ms = 1e13 ms) and prints as a plain
#: number; ``1e300`` printed 300-digit times and ``1e308`` overflowed the op costs to
#: infinity, refused as "'F': Input should be a finite number" without naming the key.
#: The efficiencies are bounded by 1 already.
MAX_OVERHEAD_MS = 1e6


def check_sizes(**sizes: int | None) -> None:
    """Refuse (:class:`WorkloadError`, rule ``sizes``) a size of :data:`MAX_SIZES` (``seq``,
    ``micro_batch_size``, ``global_batch_size``, ``num_gpus``; None: unset) above its
    bound. ``flag`` style names (``--seq``) are the caller's: the message names the key."""
    for what, value in sizes.items():
        top = MAX_SIZES[what]
        if value is not None and value > top:
            raise WorkloadError("sizes", f"{what} = {value:,} is above {top:,}, the most a "
                                f"training step has: give a real {what}")


class Workload(BaseModel):
    """One training step's setup (module docstring).

    ``model``: a preset name, a config.json path, a dict of its keys or a
    :class:`ModelConfig`; ``gpu``: a preset name, or a table ``{name = "h100-sxm", ...}``
    of overrides on it, or a :class:`Hardware`. ``seq``: tokens per sample;
    ``micro_batch_size``: samples per microbatch; ``global_batch_size``: samples per step.
    ``dp`` follows from ``num_gpus`` when unset (else 1). ``zero``: data-parallel sharding
    of optimizer states (1), plus gradients (2), plus parameters (3 = FSDP).
    ``efficiency``: achieved fraction of the roofline (compute peak and HBM bandwidth);
    ``comm_efficiency``: achieved fraction of the link bandwidths (collectives and P2P);
    ``overhead_ms``: fixed time per compute piece (kernel launches, dispatch; 0 to
    :data:`MAX_OVERHEAD_MS` ms).
    ``framework``: whose memory rules (:mod:`schedsim.workload.lifetimes`):
    ``megatron`` (gradients and FSDP copies held for the step) or ``torchtitan`` (FSDP2 +
    torch.distributed.pipelining: the sharded parameter is the fp32 master, a stage's
    gathered parameters and unsharded gradients live from its first forward / first
    weight gradient to its last backward under PP, every stage keeps its outputs and input
    gradients to the step end). ``fp8_param_gather``: FSDP all-gathers the fp8-GEMM decoder
    weights in fp8 (torchao's float8 all-gather; 1 byte a weight gathered).
    ``recv_buffers``: ``transient`` (a P2P receive buffer lives until its op consumes it;
    Megatron-LM) or ``per-microbatch`` (torch.distributed.pipelining allocates one input
    buffer per microbatch per stage, and one gradient buffer per microbatch, for the whole
    step). ``overlap_grad_reduce``: the DP gradient reduce overlaps the backward (only
    the optimizer step stays at the step boundary). ``overlap``: the stage model's
    overlap of collectives with compute (``none``, ``domino``, ``fb``, ``megatron``;
    docs/stage-model.md). ``vocab_divisor``: the vocabulary is padded to a multiple of
    ``vocab_divisor x tp`` (Megatron-LM's ``--make-vocab-size-divisible-by``, 128; 1: no
    padding, as torchtitan). ``allocator``: ``caching`` also reports the reserved bytes
    of torch's CUDA caching allocator per rank (:mod:`schedsim.workload.reserved`; what
    torchtitan logs as its memory, and what runs out), ``expandable`` the same with
    ``expandable_segments:True``, ``none`` the tensors' bytes alone;
    unset: ``caching`` under ``framework = "torchtitan"``, ``none`` under ``megatron``
    (whose own estimates count tensors).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=False, defer_build=True)

    model: ModelConfig
    gpu: Hardware
    seq: int = Field(ge=1)
    micro_batch_size: int = Field(default=1, ge=1)
    global_batch_size: int = Field(ge=1)
    num_gpus: int | None = Field(default=None, ge=1)
    tp: int = Field(default=1, ge=1)
    sequence_parallel: bool | None = None
    ep: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1)
    pp: int = Field(default=1, ge=1)
    chunks: int = Field(default=1, ge=1)
    zero: int = Field(default=1, ge=0, le=3)     # an int: strict mode refuses true
    recompute: Recompute = "none"
    params_dtype: Dtype = "bf16"
    grad_dtype: Dtype = "fp32"
    master_dtype: Dtype = "fp32"
    gemm_dtype: Dtype = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    efficiency: float = Field(default=0.5, gt=0, le=1)
    comm_efficiency: float = Field(default=0.8, gt=0, le=1)
    overhead_ms: float = Field(default=0.01, ge=0, le=MAX_OVERHEAD_MS, allow_inf_nan=False)
    layout: str | list[int] | None = None
    recv_buffers: Literal["transient", "per-microbatch"] = "transient"
    framework: Literal["megatron", "torchtitan"] = "megatron"
    fp8_param_gather: bool = False
    overlap_grad_reduce: bool = False
    flash_attention: bool = True
    dropout: bool = False
    overlap: Overlap = "none"
    vocab_divisor: int = Field(default=128, ge=1)
    allocator: Literal["caching", "expandable", "none"] | None = None

    @property
    def allocator_model(self) -> str:
        """``allocator`` resolved (``caching`` | ``expandable`` | ``none``; class
        docstring)."""
        if self.allocator is not None:
            return self.allocator
        return "caching" if self.framework == "torchtitan" else "none"

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: object) -> object:
        return load_model(v) if isinstance(v, (str, dict)) else v   # type: ignore[arg-type]

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v: object) -> object:
        if isinstance(v, str):
            return gpu_preset(v)
        if isinstance(v, dict):
            kw = dict(v)
            name = kw.pop("name", None)
            if name is None:
                raise ValueError("a gpu table needs name = one of the presets")
            return gpu_preset(name, **kw)
        return v

    # -- derived sizes -----------------------------------------------------------------
    @property
    def sp(self) -> bool:
        """Sequence parallelism: as set, else on whenever ``tp > 1``."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def data_parallel(self) -> int:
        """``dp``, else ``num_gpus / (tp x cp x pp)``, else 1."""
        if self.dp is not None:
            return self.dp
        if self.num_gpus is not None:
            return max(1, self.num_gpus // (self.tp * self.cp * self.pp))
        return 1

    @property
    def gpus(self) -> int:
        """GPUs of the run: ``tp x cp x dp x pp``."""
        return self.tp * self.cp * self.data_parallel * self.pp

    @property
    def microbatches(self) -> int:
        """Microbatches per step per pipeline: ``global_batch_size / (micro_batch_size x
        dp)`` (floor; :meth:`check` refuses a remainder)."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)

    @property
    def stages(self) -> int:
        return self.pp * self.chunks

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq

    # -- checks ------------------------------------------------------------------------
    def check(self) -> "Workload":
        """Raise :class:`WorkloadError` for the first rule broken (:data:`RULES`);
        returns self."""
        from schedsim.util.limits import check as check_limit

        check_sizes(seq=self.seq, micro_batch_size=self.micro_batch_size,
                    global_batch_size=self.global_batch_size, num_gpus=self.num_gpus)
        self._check_figures()
        m, tp, dp = self.model, self.tp, self.data_parallel
        # every per-layer loop (FLOPs, pieces, bytes) is bounded before it runs
        check_limit("instructions", 8 * m.num_hidden_layers,
                    f"a model of {m.num_hidden_layers:,} layers")

        def need(ok: bool, rule: str, msg: str) -> None:
            if not ok:
                raise WorkloadError(rule, msg)

        need(self.cp == 1, "cp not built", f"cp = {self.cp}: context parallelism is not "
             f"built in the workload model; use cp = 1")
        if self.num_gpus is not None:
            # the message names the degrees given: dp only when it was (else the GPUs
            # leave it, and the rule is that they divide into the others)
            n, mp = self.num_gpus, tp * self.cp * self.pp
            degrees = f"tp {tp}" + (f" x cp {self.cp}" if self.cp != 1 else "") + \
                f" x pp {self.pp}"
            if self.dp is None:
                need(n % mp == 0, "gpus % (tp x cp x pp)", f"{n} GPUs is not a multiple of "
                     f"{degrees} = {mp}: change the GPUs or the degrees")
            else:
                need(n == mp * dp, "gpus = tp x cp x dp x pp", f"{n} GPUs is not {degrees} "
                     f"x dp {dp} = {mp * dp}: change the GPUs or the degrees")
        need(m.num_attention_heads % tp == 0, "heads % tp",
             f"{m.num_attention_heads} attention heads do not split over tp = {tp}: pick a "
             f"tp that divides them")
        need(m.mla or m.kv_heads % tp == 0, "kv_heads % tp",
             f"{m.kv_heads} key/value heads do not split over tp = {tp}: pick a tp that "
             f"divides them (Megatron needs num_query_groups % tp == 0)")
        need(tp <= self.gpu.gpus_per_node and self.gpu.gpus_per_node % tp == 0,
             "tp within a node", f"tp = {tp} does not fit the {self.gpu.gpus_per_node} GPUs "
             f"of a {self.gpu.name} node: use a tp dividing {self.gpu.gpus_per_node}")
        need(not (self.sp and self.seq % tp), "seq % tp",
             f"seq = {self.seq} does not split over tp = {tp} for sequence parallelism: "
             f"pick a seq that tp divides")
        if m.experts:
            need(m.experts % self.ep == 0, "experts % ep", f"{m.experts} experts do not "
                 f"split over ep = {self.ep}: pick an ep that divides them")
            need((tp * dp) % self.ep == 0, "ep divides tp x dp", f"ep = {self.ep} does not "
                 f"divide tp x dp = {tp * dp}: expert-parallel ranks come from the "
                 f"tensor- and data-parallel ones")
        else:
            need(self.ep == 1, "moe needs ep", f"ep = {self.ep} on the dense model "
                 f"{m.name}: expert parallelism needs experts; use ep = 1")
        mb = self.micro_batch_size * dp
        need(self.global_batch_size % mb == 0, "global_batch_size % (micro_batch_size x dp)",
             f"global_batch_size = {self.global_batch_size} is not a multiple of "
             f"micro_batch_size x dp = {self.micro_batch_size} x {dp} = {mb}: use "
             f"{_nearest_multiples(self.global_batch_size, mb)}")
        for what, dt in (("gemm_dtype", self.gemm_dtype), ("params_dtype", self.params_dtype)):
            need(dt in self.gpu.peak_tflops, "gemm dtype on gpu",
                 f"{self.gpu.name} has no {dt} tensor-core peak: set {what} to one of "
                 f"{', '.join(self.gpu.peak_tflops)}")
        self.stage_layout()
        return self

    def _check_figures(self) -> None:
        """The per-op figures of :data:`FIGURES` within their bounds again (WorkloadError,
        rule ``sizes``): a workload copied with ``model_copy(update=...)`` is not
        validated, and ``overhead_ms = -1`` there gave negative op costs."""
        from schedsim.util.validation import out_of_range

        for name in FIGURES:
            bad = out_of_range(Workload, name, getattr(self, name), UNITS)
            if bad is not None:
                raise WorkloadError("sizes", bad)

    def stage_layout(self) -> list[StageLayout]:
        """What each of the :attr:`stages` holds (module docstring). Raises
        :class:`WorkloadError` (rule ``layers fill pp x chunks stages`` or ``layout``)."""
        return _stage_layout(self.layout, self.model.num_hidden_layers, self.pp, self.chunks)


def _nearest_multiples(value: int, step: int) -> str:
    """The multiples of ``step`` next to ``value`` (never below ``step``): ``"8 or 16"``,
    or one number when both are the same."""
    lo, hi = max(step, value // step * step), max(step, -(-value // step) * step)
    return f"{lo}" if lo == hi else f"{lo} or {hi}"


def _unknown_key(source: str, unknown: list[str], missing: list[str]) -> str:
    """The message of the first ``unknown`` key of a ``[workload]`` table: the closest
    ``missing`` (required) key if any is close, else the closest key
    (:func:`~schedsim.util.suggest.closest`), with the other missing keys and the keys
    allowed: ``unknown key 'sequence' (did you mean 'seq'?)``."""
    from schedsim.util.suggest import closest

    k = unknown[0]
    best = closest(k, missing) or closest(k, Workload.model_fields)
    hint = f" (did you mean {best!r}?)" if best else ""
    rest = [m for m in missing if m != best]
    need = (f"; {', '.join(map(repr, rest))} {'is' if len(rest) == 1 else 'are'} required"
            if rest else "")
    return (f"{source}: unknown key {k!r}{hint}{need} (keys: "
            f"{', '.join(Workload.model_fields)})")


def workload_from_dict(data: dict[str, Any], source: str = "[workload]") -> Workload:
    """A :class:`Workload` from a ``[workload]`` table, not yet :meth:`checked
    <Workload.check>`, validated in pydantic's strict mode as the scenario's other tables
    (:func:`schedsim.scenario.parse_scenario`): a quoted number or a boolean where a
    number goes (``tp = "8"``, ``zero = true``) is refused with the type expected and the
    one given. ``model`` and ``gpu`` (a name, a path or a table) are loaded by their own
    rules (:func:`~schedsim.workload.model.load_model`,
    :func:`~schedsim.workload.hardware.gpu_preset`). Raises :class:`ScenarioError`
    naming the bad key or value (a figure out of its bounds with the allowed range:
    :func:`~schedsim.util.validation.range_error`)."""
    from pydantic import ValidationError

    from schedsim.errors import SchedsimError, Stopped
    from schedsim.util.validation import format_validation, range_error

    try:
        return Workload.model_validate(data, strict=True)
    except ValidationError as e:
        errors = e.errors()
        of = {t: [".".join(str(x) for x in r["loc"]) for r in errors if r["type"] == t]
              for t in ("extra_forbidden", "missing")}
        if of["extra_forbidden"]:       # named first: it may be the missing key misspelt
            raise ScenarioError(_unknown_key(source, *of.values())) from None
        err = errors[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "missing":
            raise ScenarioError(f"{source}: {loc!r} is required") from None
        bound = range_error(err, Workload, UNITS)
        if bound is not None:
            raise ScenarioError(f"{source}: {bound}") from None
        raise ScenarioError(format_validation(e, source, Workload)) from None
    except Stopped:
        raise           # a stop signal is the user's, never the input's error
    except SchedsimError as e:
        raise ScenarioError(f"{source}: {e}") from None
