"""Which decoder layers each pipeline stage holds (:class:`StageLayout`): an even split
(Megatron-LM's default), a Megatron-LM ``pipeline_model_parallel_layout`` string
(:func:`parse_layout`), a list of counts, or torchtitan's automatic splits
(:func:`torchtitan_split`, :func:`torchtitan_llm_split`); and :class:`WorkloadError`,
the one error of a workload that cannot run. :class:`schedsim.workload.layout.Workload`
(``stage_layout``) uses them; ``layout.py``'s docstring states the layout forms."""
from __future__ import annotations

import re
from dataclasses import dataclass

from schedsim.errors import ScenarioError


class WorkloadError(ScenarioError):
    """A workload that cannot run: one line naming the rule and the fix; ``rule`` is one
    of :data:`RULES` (what ``schedsim plan`` counts rejections by)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class StageLayout:
    """What stage ``stage`` holds: ``embedding``, decoder layers ``first`` to
    ``first + layers - 1``, and ``head`` (final norm, LM head, loss)."""

    stage: int
    first: int
    layers: int
    embedding: bool
    head: bool


def _stage_layout(layout: str | list[int] | None, layers: int, pp: int, chunks: int
                  ) -> list[StageLayout]:
    stages = pp * chunks
    fill = "layers fill pp x chunks stages"
    if layout is None:
        if layers % stages:
            raise WorkloadError(fill, f"{layers} layers do not fill pp x chunks = {pp} x "
                                f"{chunks} = {stages} stages evenly: give a layout (a "
                                f"per-stage list or a Megatron layout string such as "
                                f"'Et*{layers // stages}|...|L') or other pp/chunks")
        per = [layers // stages] * stages
        return _from_counts(per, [0], [stages - 1])
    if layout == "torchtitan":
        if stages > layers:
            raise WorkloadError(fill, f"{stages} stages for {layers} layers: torchtitan "
                                f"needs at least one layer a stage; use fewer stages")
        return _from_counts(torchtitan_split(layers, stages), [0], [stages - 1])
    if isinstance(layout, str):
        rows = parse_layout(layout)
        if len(rows) != stages:
            raise WorkloadError(fill, f"layout {layout!r} has {len(rows)} stages but pp x "
                                f"chunks = {pp} x {chunks} = {stages}")
        emb = [i for i, r in enumerate(rows) if "E" in r]
        head = [i for i, r in enumerate(rows) if "L" in r]
        if emb != [0] or head != [stages - 1] or rows[0].count("E") != 1 or rows[-1].count("L") != 1:
            raise WorkloadError("layout", f"layout {layout!r}: E must open the first stage "
                                f"and L close the last, once each (Megatron's rule)")
        if any(r.index("E") != 0 for r in rows if "E" in r) or rows[-1][-1] != "L":
            raise WorkloadError("layout", f"layout {layout!r}: E comes first, L last")
        per = [r.count("t") for r in rows]
    else:
        per = list(layout)
        if len(per) != stages or any(not isinstance(n, int) or n < 0 for n in per):
            raise WorkloadError(fill, f"layout lists {len(per)} stages but pp x chunks = "
                                f"{pp} x {chunks} = {stages} (one layer count >= 0 each)")
    if sum(per) != layers:
        raise WorkloadError(fill, f"the layout places {sum(per)} decoder layers but the "
                            f"model has {layers}")
    return _from_counts(per, [0], [stages - 1])


def torchtitan_split(layers: int, stages: int) -> list[int]:
    """Decoder layers per stage as torchtitan splits them when no split points are given
    (``pipelining_utils.py::generate_split_points`` @9dec370): ``base = layers // stages``,
    the first stage gets ``base``, the next ``layers % stages`` stages ``base + 1``, the
    rest ``base``, and the last whatever remains (126 layers: 8 stages ``[15, 16 x 6, 15]``,
    16 stages ``[7, 8 x 14, 7]``). ``1 <= stages <= layers``."""
    base, extra = divmod(layers, stages)
    per = [base] + [base + 1] * min(extra, stages - 2) + [base] * max(0, stages - 2 - extra)
    per = per[:stages - 1] if stages > 1 else []
    return per + [layers - sum(per)]


def torchtitan_llm_split(layers: int, stages: int, first_less: int = 1,
                         last_less: int = 1) -> list[int]:
    """Decoder layers per stage (a list of ``stages`` counts summing to ``layers``) as
    torchtitan's pipeline splits an LLM when no modules per stage are given:
    ``torchtitan/distributed/pipeline_parallel.py::_generate_llm_fqn_per_model_part``
    (pytorch/torchtitan @b5bcd76), with ``first_less`` / ``last_less`` its
    ``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers``
    (both 1 by default, ``torchtitan/config/configs.py``). The embedding counts as
    ``first_less`` layers and the norm + LM head as ``last_less``; the
    ``layers + first_less + last_less`` effective layers split evenly, the remainder one
    each on the first stages, and the first and last stage then hold that many decoder
    layers fewer. 126 layers: 4 stages ``[31, 32, 32, 31]``, 5 stages
    ``[25, 26, 26, 25, 24]``, 8 stages ``[15, 16 x 6, 15]``. One stage holds every layer.
    Raises :class:`WorkloadError` (rule ``layers fill pp x chunks stages``, naming how many
    stages fit) where torchtitan raises ``ValueError``: more stages than effective layers,
    or a weight above the even share (a stage would hold fewer than 0 layers)."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    base, extra = divmod(effective, stages)
    if base == 0 or first_less > base or last_less > base:
        most = effective // max(1, first_less, last_less)
        why = ("fewer than one a stage" if base == 0 else f"{base} a stage, fewer than the "
               f"{max(first_less, last_less)} the embedding or the norm + head takes")
        raise WorkloadError("layers fill pp x chunks stages", f"{stages} stages for {layers} "
                            f"layers: torchtitan's split counts the embedding and the norm + "
                            f"head as {first_less} + {last_less} more layers, {effective} in "
                            f"all: {why}; use at most {most} stages (pp x chunks)")
    per = [base + (s < extra) for s in range(stages)]
    per[0] -= first_less
    per[-1] -= last_less
    return per


def _from_counts(per: list[int], emb: list[int], head: list[int]) -> list[StageLayout]:
    out, first = [], 0
    for s, n in enumerate(per):
        out.append(StageLayout(s, first, n, s in emb, s in head))
        first += n
    return out


_REPEAT_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT_ONE = re.compile(r"(.)\*(\d+)")


def parse_layout(text: str) -> list[str]:
    """Megatron's ``pipeline_model_parallel_layout`` string → one string of layer
    symbols per stage (``E``, ``t``, ``L``), as ``parse_str_to_list`` unrolls it (commas
    dropped, ``(...)*n`` then ``x*n`` expanded, split at ``|``). Raises
    :class:`WorkloadError` (rule ``layout``) for another symbol (``m``: MTP is not built)
    or a repeat count past 10,000."""
    s = text.replace(",", "").replace(" ", "")
    for pat in (_REPEAT_GROUP, _REPEAT_ONE):
        def rep(mt: re.Match) -> str:
            n = int(mt.group(2))
            if n > 10_000:
                raise WorkloadError("layout", f"layout {text!r}: repeat count {n} > 10000")
            return mt.group(1) * n
        s = pat.sub(rep, s)
    rows = s.split("|")
    bad = sorted({c for c in s if c not in "EtL|"})
    if bad:
        what = ("m (multi-token prediction) is not built" if bad == ["m"] else
                f"unknown symbol {bad[0]!r}")
        raise WorkloadError("layout", f"layout {text!r}: {what}; symbols are E (embedding), t "
                            f"(decoder layer), L (head and loss), | (next stage), x*n repeats")
    return rows
