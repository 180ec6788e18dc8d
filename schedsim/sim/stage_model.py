"""The stage model (``[model]`` of a scenario): what happens inside one stage's op.

A pipeline stage is itself tensor-parallel (and, for MoE, expert-parallel): every layer's
attention and MLP run on ``tp`` GPUs that exchange partial results with collectives. From
the layers, their per-layer compute costs and the group sizes this module derives each
op's internal sequence of pieces and, with :mod:`schedsim.sim.overlap`, its cost:

- **F**, per layer: attention, then the all-reduce of the attention output projection
  (Megatron's *g* operator, ``mappings.reduce_from_tensor_model_parallel_region``), then
  the MLP and the all-reduce after ``fc2`` (g again). With ``sequence_parallel`` each
  all-reduce becomes a reduce-scatter and an all-gather precedes QKV and ``fc1``
  (``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_parallel_region``).
  With ``moe`` the MLP is the expert layer: all-to-all dispatch, experts, all-to-all
  combine on the EP group (DeepSeek-V3 report, section 3.2.1: attention, dispatch, MLP,
  combine).
- **B** (input gradient), layers in reverse: MLP input-gradient, then the all-reduce of the
  input gradient at ``fc1`` (the backward of Megatron's *f*,
  ``copy_to_tensor_model_parallel_region``), then attention and the all-reduce at QKV.
  Sequence parallelism: all-gather of the output gradient and reduce-scatter of the input
  gradient instead. MoE: the combine's backward (an all-to-all), experts, the dispatch's
  backward (an all-to-all).
- **W** (weight gradient): compute only, no collective (tensor-parallel weights are
  sharded, their gradients local; the gathered inputs are assumed kept for W, as the B/W
  split needs them — Megatron's fused backward re-gathers them instead).
- **BW** = B then W; **FB** = an F and a B or BW of two microbatches.

Megatron-LM ``megatron/core/tensor_parallel/mappings.py`` and ``layers.py`` give the places
of the collectives. Collective times: :mod:`schedsim.sim.collectives` (nccl-tests
conventions). Overlap (``overlap``):

- ``none``: every op is one chain, its cost the sum of its pieces;
- ``domino``: the microbatch is split in two halves (each compute piece costs half,
  each collective moves half the bytes) whose pieces interleave, so one half's
  collective runs during the other half's compute (DeepSpeed
  ``deepspeed/runtime/domino/transformer.py``: ``handle0`` waits while half 1 computes);
  in BW the weight gradients also run while the input-gradient all-reduce is in flight
  (Domino's ``async_linear.py``, Megatron's async dgrad all-reduce). W and FB as ``none``
  (FB = its two parts back to back);
- ``fb``: F, B, W, BW as ``none``; in an FB pair each part's collectives overlap the other
  part's compute (DualPipe, DeepSeek-V3 section 3.2.1 and its figure 4);
- ``megatron``: as ``fb``, but the pair's pieces are launched in Megatron-LM's
  combined-1F1B order, layer by layer (:mod:`schedsim.sim.combined`), and each stream
  runs them in that order (``delay_wgrad``: Megatron's ``delay_wgrad_compute``, the
  weight gradients launched after the next all-to-all instead of inside their backward).

Device options of the rank (:func:`schedsim.sim.overlap.schedule`): ``connections``
(``[comm] connections``, ``CUDA_DEVICE_MAX_CONNECTIONS``; 1 = one in-order hardware
queue for both streams) and ``comm_slowdown`` (compute this many times slower while a
collective runs; per stage with ``[model.stage.N]``, i.e. per rank).

The compute costs are those of one rank (one GPU's share of the layer), in the unit of
``[costs]``; ``activation_bytes`` is one microbatch's activation (``seq x mb x hidden x
bytes per element``): the ``S`` of every TP collective, ``topk`` times it (over ``tp``
with sequence parallelism) of an all-to-all, and the P2P message size (over ``tp`` with
sequence parallelism, as Megatron sends the sequence shard).

Plain Python (no torch). The pieces and the costs
(:class:`~schedsim.sim.stage_costs.StageCosts`,
:func:`~schedsim.sim.stage_costs.phase_pieces`) are in :mod:`schedsim.sim.stage_costs`,
imported where used: a scenario without ``[model]`` does not import the overlap
scheduler.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schedsim.sim.collectives import ModelLinks

Overlap = Literal["none", "domino", "fb", "megatron"]
KINDS = ("F", "B", "W", "BW")


class BlockCosts(BaseModel):
    """Per-layer compute cost of one block (attention or MLP) on one rank, per phase."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    F: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    B: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    W: float = Field(default=0.5, ge=0, allow_inf_nan=False)


class StageOverride(BaseModel):
    """``[model.stage.N]``: stage N's layers and block costs (unset: the model's).

    ``embedding`` / ``head``: the costs of the stage's input embedding (its F first, its
    W last; an embedding has no input gradient, so its B is usually 0) and of its final
    norm, LM head and loss (F last, B and W first), with their tensor-parallel
    collectives (Megatron's ``VocabParallelEmbedding`` reduces its output; the LM head is
    a column-parallel layer: an all-gather of its input under sequence parallelism, the
    input gradient's all-reduce or reduce-scatter in B); in Megatron's combined FB order
    they belong to the attention block. ``dense_layers``: with ``moe``, how many of the
    stage's layers (its first ones, as DeepSeek-V3's ``first_k_dense_replace`` puts them)
    have a dense MLP costing ``dense_mlp`` with the TP collectives of a dense layer."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    layers: int | None = Field(default=None, ge=0)
    attention: BlockCosts | None = None
    mlp: BlockCosts | None = None
    comm_slowdown: float | None = Field(default=None, ge=1, allow_inf_nan=False)
    embedding: BlockCosts | None = None
    head: BlockCosts | None = None
    dense_layers: int | None = Field(default=None, ge=0)
    dense_mlp: BlockCosts | None = None


class StageModel(BaseModel):
    """``[model]``: layers, block costs, parallel sizes, activation size and overlap.

    Example::

        [model]
        layers = 4                       # transformer layers per stage
        tp = 4                           # tensor-parallel size
        sequence_parallel = false
        moe = true                       # the MLP is an expert layer ...
        ep = 8                           # ... on an expert-parallel group of 8
        topk = 2                         # experts per token (all-to-all bytes x topk)
        activation_bytes = 16e6          # one microbatch's activation, bytes
        overlap = "fb"                   # none | domino | fb | megatron
        delay_wgrad = false              # megatron: Megatron's delay_wgrad_compute
        comm_slowdown = 1.0              # compute x this while a collective runs
        attention = { F = 1.0, B = 1.0, W = 0.6 }   # per layer, one rank
        mlp = { F = 1.2, B = 1.2, W = 0.8 }
        [model.links]                    # bus bandwidth (bytes / unit), latency (unit)
        gpus_per_node = 8
        intra = { bandwidth = 150e6, latency = 0.001 }
        inter = { bandwidth = 40e6, latency = 0.005 }
        [model.stage.0]                  # per-stage override
        layers = 3

    Raises ``ValueError`` (a :class:`~schedsim.errors.ScenarioError` through the scenario)
    for ``ep > 1`` or ``topk > 1`` without ``moe``.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    layers: int = Field(default=1, ge=0)
    attention: BlockCosts = Field(default_factory=BlockCosts)
    mlp: BlockCosts = Field(default_factory=BlockCosts)
    tp: int = Field(default=1, ge=1)
    sequence_parallel: bool = False
    moe: bool = False
    ep: int = Field(default=1, ge=1)
    topk: int = Field(default=1, ge=1)
    activation_bytes: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    overlap: Overlap = "none"
    delay_wgrad: bool = False
    comm_slowdown: float = Field(default=1.0, ge=1, allow_inf_nan=False)
    links: ModelLinks = Field(default_factory=ModelLinks)
    stage: dict[int, StageOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "StageModel":
        if not self.moe and (self.ep > 1 or self.topk > 1):
            raise ValueError(f"ep = {self.ep} and topk = {self.topk} describe an MoE "
                             f"layer: set moe = true (or drop them)")
        from schedsim.util.limits import check

        # a group's GPUs count against the ranks limit (tp = 10**30 was accepted)
        check("ranks", self.tp * self.ep, f"[model] tp = {self.tp:,} x ep = {self.ep:,}: a "
                                          f"group of {self.tp * self.ep:,} GPUs")
        self._check_inter_link()
        return self

    def _check_inter_link(self) -> None:
        """A TP group (``tp`` GPUs) or EP group (``tp x ep``) wider than a node runs on the
        inter-node link: with ``[model.links] intra`` set and ``inter`` not, its
        collectives would silently cost nothing (tp = 8 ran 105.6 and tp = 9 30). Raises
        ValueError naming the group and the key to set."""
        lk = self.links
        if "intra" not in lk.model_fields_set or "inter" in lk.model_fields_set:
            return
        for name, gpus, n in (("TP", self.tp, self.tp), ("EP", self.tp * self.ep, self.ep)):
            if n > 1 and gpus > lk.gpus_per_node:
                raise ValueError(f"the {name} group spans {gpus} GPUs, more than "
                                 f"gpus_per_node = {lk.gpus_per_node}, so it runs on the "
                                 f"inter-node link, which [model.links] does not set (its "
                                 f"collectives would be free): set [model.links] inter = "
                                 f"{{ bandwidth = ..., latency = ... }}")

    def message_bytes(self) -> float | None:
        """Bytes of one P2P activation/gradient message (None without
        ``activation_bytes``): the sequence shard with sequence parallelism."""
        if not self.activation_bytes:
            return None
        return self.activation_bytes / (self.tp if self.sequence_parallel else 1)

