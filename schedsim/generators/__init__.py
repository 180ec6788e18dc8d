"""Schedule generators and their registry (name -> generator).

A generator takes ``ranks``, ``microbatches`` and its own keyword parameters and returns
either a :class:`~schedsim.program.ir.Schedule` (compute order only; lowered to a program by a comm
policy) or a :class:`~schedsim.program.ir.Program` (schedules that fix their own P2P order, such as
DualPipe). :func:`build_program` gives a Program in both cases.

Each generator module registers itself with :func:`register`; ``schedsim list`` prints the
registry.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from schedsim.errors import ScheduleError
from schedsim.program.ir import Program, Schedule


@dataclass
class GeneratorSpec:
    """A registered generator: its function and what ``schedsim list`` shows."""

    name: str
    fn: Callable[..., Schedule | Program]
    summary: str
    constraints: str
    placement: str
    source: str
    params: dict[str, str] = field(default_factory=dict)

    def accepted(self) -> list[str]:
        sig = inspect.signature(self.fn)
        return [p for p in sig.parameters if p not in ("ranks", "microbatches")]


GENERATORS: dict[str, GeneratorSpec] = {}


def register(name: str, *, summary: str, constraints: str, placement: str, source: str,
             params: dict[str, str] | None = None) -> Callable:
    """Decorator: register ``fn(ranks, microbatches, **params)`` as generator ``name``."""
    def deco(fn: Callable[..., Schedule | Program]) -> Callable[..., Schedule | Program]:
        GENERATORS[name] = GeneratorSpec(name, fn, summary, constraints, placement, source,
                                         params or {})
        return fn
    return deco


#: schedule names other tools use, with schedsim's (Megatron-LM's schedules.py function
#: and argument names, torch's Schedule classes, DeepSpeed's)
FOREIGN_NAMES = {
    "megatron-interleaved": "interleaved-1f1b --variant megatron",
    "interleaved": "interleaved-1f1b", "interleaved1f1b": "interleaved-1f1b",
    "megatron": "1f1b", "pipedream-flush": "1f1b", "one-f-one-b": "1f1b",
    "schedule1f1b": "1f1b", "schedulegpipe": "gpipe", "scheduleinterleaved1f1b":
    "interleaved-1f1b --variant torch", "scheduleloopedbfs": "looped-bfs",
    "scheduleinterleavedzerobubble": "interleaved-zb", "schedulezbvzerobubble": "zbv",
    "scheduledualpipev": "dualpipev", "zero-bubble": "zb-h1", "zb": "zb-h1", "zbh1": "zb-h1",
    "zbh2": "zb-h2", "dualpipe-v": "dualpipev",
}
#: parameter names other tools use (Megatron-LM's arguments), with schedsim's flag
FOREIGN_KEYS = {
    "pipeline_model_parallel_size": "ranks (--ranks/-p)",
    "pipeline_parallel_size": "ranks (--ranks/-p)", "pp": "ranks (--ranks/-p)",
    "pp_size": "ranks (--ranks/-p)", "num_stages": "ranks (--ranks/-p; stages per rank: "
    "--chunks)", "num_microbatches": "microbatches (--microbatches/-m)",
    "n_microbatches": "microbatches (--microbatches/-m)",
    "virtual_pipeline_model_parallel_size": "chunks (--chunks)",
    "num_layers_per_virtual_pipeline_stage": "chunks (--chunks: stages per rank)",
    "microbatch_group_size_per_vp_stage": "group_size (--param group_size=N)",
}


def foreign_key_hint(key: str) -> str | None:
    """``"'num_microbatches' is another tool's name: schedsim's is microbatches (...)"``
    for a parameter name other tools use, else None."""
    ours = FOREIGN_KEYS.get(key.lower().replace("-", "_"))
    return None if ours is None else (f"{key!r} is Megatron-LM's / torch's name: schedsim "
                                      f"calls it {ours}")


def get(name: str) -> GeneratorSpec:
    """The generator called ``name``. Raises :class:`ScheduleError` naming the choices (and
    schedsim's name for a name another tool uses, :data:`FOREIGN_NAMES`). Imports only
    the module of ``name`` (:data:`MODULE_OF`); every module for another name."""
    spec = GENERATORS.get(name)
    if spec is None:
        _load(name)
        spec = GENERATORS.get(name)
    if spec is None:
        ours = FOREIGN_NAMES.get(name.lower().replace("_", "-"))
        if ours is not None:
            raise ScheduleError(f"unknown schedule {name!r}: that is another tool's name; "
                                f"schedsim's is -s {ours} (see 'schedsim list')")
        raise ScheduleError(f"unknown schedule {name!r}: expected one of "
                            f"{', '.join(sorted(GENERATORS))} (see 'schedsim list')")
    return spec


def generate(name: str, ranks: int, microbatches: int, **params: Any) -> Schedule | Program:
    """Run generator ``name``. Unset parameters (None) take the generator's defaults.
    The result is a validated value: a generator that builds it from arrays proves it by
    its tests; one built from object rows is checked here, once (over the arrays), and
    never again.

    Raises :class:`ScheduleError` for an unknown schedule, an unknown parameter or a
    combination the schedule does not support (the message names the rule).
    """
    spec = get(name)
    params = {k: v for k, v in params.items() if v is not None}
    accepted = spec.accepted()
    for k in params:
        if k not in accepted:
            hint = foreign_key_hint(k)
            raise ScheduleError(hint or f"schedule {name!r} takes no parameter {k!r} (it "
                                f"takes: {', '.join(accepted) or 'none'})")
    if ranks < 1 or microbatches < 1:
        raise ScheduleError(f"{name}: ranks and microbatches must be >= 1 (got {ranks}, "
                            f"{microbatches})")
    out = spec.fn(ranks, microbatches, **coerce_params(spec, params))
    if out.validated:
        return out
    from schedsim.program.validate import validate_all

    return validate_all(out)


def coerce_params(spec: GeneratorSpec, params: dict[str, Any]) -> dict[str, Any]:
    """Parameters converted to the generator's annotated types (``"no"`` -> False for a
    bool, ``"3"`` -> 3 for an int). Raises :class:`ScheduleError` naming a bad value."""
    import typing

    from pydantic import TypeAdapter, ValidationError

    hints = typing.get_type_hints(spec.fn)
    out = {}
    for k, v in params.items():
        ann = hints.get(k)
        if ann is None or k in ("costs", "link"):
            out[k] = v
            continue
        try:
            out[k] = TypeAdapter(ann).validate_python(v)
        except ValidationError as e:
            raise ScheduleError(f"schedule {spec.name!r}: bad value {k}={v!r}: "
                                f"{e.errors()[0]['msg']}") from None
    return out


def build_program(name: str, ranks: int, microbatches: int, comm_policy: str | None = None,
                  **params: Any) -> Program:
    """Generate ``name`` and lower it with ``comm_policy`` (default ``async``) if it is a
    compute-only schedule. Schedules that fix their own comm (DualPipe) ignore the policy
    unless one is given explicitly, in which case their compute order is re-lowered.

    ``params`` holds the generator's parameters and the policy's (see
    :data:`schedsim.program.lower.POLICIES`); a key goes to the policy when the policy
    declares it. Raises :class:`ScheduleError` for a key neither takes (naming the policy
    that does, if another one does).
    """
    from schedsim.program.lower import get_policy, lower, policy_of_param
    from schedsim.util.gc import no_gc

    pol = get_policy(comm_policy or "async")
    policy_params = {k: params.pop(k) for k in list(params) if k in pol.params}
    accepted = get(name).accepted()
    for k, v in params.items():
        owners = policy_of_param(k)
        if v is not None and k not in accepted and owners:
            raise ScheduleError(f"{k} is a parameter of the {' / '.join(owners)} comm policy, "
                                f"not of schedule {name!r}: add --comm-policy {owners[0]}")
    with no_gc():
        # a generator proven by its tests (parity with the reference implementations)
        # builds a validated value; the policies keep it (Schedule.validated)
        out = generate(name, ranks, microbatches, **params)
        if isinstance(out, Program):
            if comm_policy is None:
                return out
            return lower(out.schedule(), comm_policy, **policy_params)
        return lower(out, comm_policy or "async", **policy_params)


#: generator modules, imported on first use (each registers its generators); the registry
#: lists the generators in this order
_MODULES = ("basic", "dualpipe", "dualpipev", "zerobubble", "zerobubble_v", "torch_family",
            "variants", "overlapped")
#: the module (of :data:`_MODULES`) that registers each generator: :func:`get` imports only
#: that one (a small ``simulate`` does not import the planners);
#: tests/test_cli_imports.py checks it against what the modules register
MODULE_OF = {
    **dict.fromkeys(("gpipe", "1f1b"), "basic"), "dualpipe": "dualpipe",
    "dualpipev": "dualpipev", **dict.fromkeys(("zb-h1", "zb-h2", "zb-1p", "zb-2p"), "zerobubble"),
    **dict.fromkeys(("zbv", "v-half", "v-min"), "zerobubble_v"),
    **dict.fromkeys(("interleaved-1f1b", "looped-bfs", "interleaved-zb"), "torch_family"),
    "1f1b-megatron-figure": "variants",
    **dict.fromkeys(("1f1b-overlap", "interleaved-overlap"), "overlapped"),
}
_loaded_all = False


def _load(name: str) -> None:
    """Import the module that registers ``name`` (:data:`MODULE_OF`), or every module
    for a name it does not know."""
    mod = MODULE_OF.get(name)
    if mod is None:
        _load_all()
        return
    import importlib

    importlib.import_module(f"{__name__}.{mod}")


def _load_all() -> None:
    """Import every generator module; :data:`GENERATORS` then lists the generators in
    :data:`_MODULES` order (each module's in its registration order; the others after),
    whichever were imported first."""
    global _loaded_all
    if _loaded_all:
        return
    import importlib

    for mod in _MODULES:
        importlib.import_module(f"{__name__}.{mod}")
    rank = {m: i for i, m in enumerate(_MODULES)}
    items = sorted(GENERATORS.items(),
                   key=lambda kv: rank.get(MODULE_OF.get(kv[0], ""), len(rank)))
    GENERATORS.clear()
    GENERATORS.update(items)
    _loaded_all = True


def names() -> list[str]:
    """Registered generator names, in registration order."""
    _load_all()
    return list(GENERATORS)


def generated_stages(gen: Any, ranks: int, params: dict[str, Any]) -> int:
    """The stages generator ``gen`` builds on ``ranks`` ranks with ``params``, from its
    registered placement (``v``: 2 per rank; ``loop`` with a ``chunks`` parameter: that
    many per rank, else 1; ``dual``: 1), before anything is generated."""
    import inspect

    if gen.placement.startswith("v"):
        return 2 * ranks
    if "chunks" in gen.accepted():
        chunks = params.get("chunks")
        if chunks is None:
            chunks = inspect.signature(gen.fn).parameters["chunks"].default
        try:
            return ranks * max(1, int(chunks))
        except (TypeError, ValueError, OverflowError):
            return ranks        # the generator names the bad value
    return ranks
