"""A pydantic validation error as one line naming the key: the allowed keys for an unknown
one, the type expected and the value given for a wrong type. Used by the scenario loader
(:func:`schedsim.scenario.parse_scenario`) and the ``[workload]`` table
(:func:`schedsim.workload.layout.workload_from_dict`)."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def allowed_keys(root: Any, loc: tuple) -> list[str]:
    """Field names allowed at the parent of ``loc`` in the model tree of ``root`` (a
    pydantic model class: :class:`~schedsim.scenario.Scenario`)."""
    import typing

    model: object = root
    for part in loc[:-1]:
        fields = getattr(model, "model_fields", None)
        if fields is None or not isinstance(part, str) or part not in fields:
            if isinstance(part, int) or fields is None:
                continue
            return []
        ann = fields[part].annotation
        for arg in (ann, *typing.get_args(ann)):
            for sub in (arg, *typing.get_args(arg)):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    model = sub
                    break
    fields = getattr(model, "model_fields", {})
    return [k for k in fields if k != "base_dir"]


def format_validation(e: ValidationError, source: str, root: Any) -> str:
    """One line of the first three errors of ``e`` (a validation of ``root``) for input
    ``source``: an unknown key with the keys allowed there, else the key, pydantic's
    message and, for a wrong type, the type and value given."""
    msgs = []
    from schedsim.util.text import clip, shorten_quotes

    for err in e.errors()[:3]:
        if err["type"] == "extra_forbidden":
            loc = clip(".".join(str(x) for x in err["loc"]))
            allowed = allowed_keys(root, tuple(err["loc"]))
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            msgs.append(f"unknown key '{loc}'{hint}")
        else:
            msgs.append(describe_error(err))
    more = f" (+{e.error_count() - 3} more)" if e.error_count() > 3 else ""
    return f"{source}: " + "; ".join(msgs) + more


#: the prefixes pydantic puts before a validator's own message ("Value error, peak_tflops
#: bf16 must be ..."): the message is the validator's, said once
_VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")


def error_text(err: Any) -> str:
    """What is wrong in one pydantic error (an item of ``ValidationError.errors()``):
    pydantic's message (a validator's own message without pydantic's "Value error, ") and,
    for a wrong type, the type and value given."""
    from schedsim.util.text import clip, shorten_quotes

    msg = err["msg"]
    for prefix in _VALIDATOR_PREFIXES:
        msg = msg.removeprefix(prefix)
    got = (f" (got {type(err['input']).__name__} {clip(repr(err['input']), 30)})"
           if err["type"].endswith(("_type", "_parsing")) else "")
    return f"{shorten_quotes(msg)}{got}"


def error_location(loc: tuple) -> str:
    """A pydantic error's location as a reader names the key: ``('peak_tflops', 'bf16')``
    -> ``'peak_tflops.bf16'``; a bad dict key (pydantic's ``[key]`` step) -> ``key 'fp9'
    of 'peak_tflops'``; the model as a whole (an empty location, a model validator) ->
    ``""``."""
    from schedsim.util.text import clip

    parts = [str(x) for x in loc]
    if len(parts) >= 2 and parts[-1] == "[key]":
        where = ".".join(parts[:-2])
        return f"key {clip(parts[-2])!r}" + (f" of '{clip(where)}'" if where else "")
    return f"'{clip('.'.join(parts))}'" if parts else ""


def describe_error(err: Any) -> str:
    """One pydantic error as ``LOCATION: WHAT`` (:func:`error_location`,
    :func:`error_text`); only ``WHAT`` where the error is the model's as a whole."""
    loc = error_location(tuple(err["loc"]))
    return f"{loc}: {error_text(err)}" if loc else error_text(err)


#: pydantic's error types of a bound broken (``Field(ge=..., le=...)``, a non-finite
#: number under ``allow_inf_nan=False``)
RANGE_ERRORS = ("greater_than_equal", "greater_than", "less_than_equal", "less_than",
                "finite_number")


def _num(x: float) -> str:
    """A bound as text: ``1,048,576``, ``0.5``, ``1e+12``."""
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:g}"


def _bounds(model: Any, name: str) -> tuple[Any, Any, bool]:
    """``(lower, upper, finite)`` of field ``name`` of ``model``: each bound ``(value,
    ">=" | ">" | "<=" | "<")`` or None, from its ``Field`` metadata; ``finite``: infinities
    and NaN refused."""
    import annotated_types as at

    lo = hi = None
    finite = False
    for m in model.model_fields[name].metadata:
        if isinstance(m, at.Ge):
            lo = (m.ge, ">=")
        elif isinstance(m, at.Gt):
            lo = (m.gt, ">")
        elif isinstance(m, at.Le):
            hi = (m.le, "<=")
        elif isinstance(m, at.Lt):
            hi = (m.lt, "<")
        elif getattr(m, "allow_inf_nan", True) is False:
            finite = True
    return lo, hi, finite


def out_of_range(model: Any, name: str, value: float, units: dict[str, str] | None = None
                 ) -> str | None:
    """The message of :func:`range_error` when ``value`` breaks the bounds of field
    ``name`` of ``model`` (for an object built without validation: ``model_copy(update=
    ...)``, ``model_construct``), else None. NaN breaks any bound."""
    import math
    import operator

    from schedsim.util.text import clip

    lo, hi, finite = _bounds(model, name)
    ops = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
    v = float(value)
    ok = not (finite and not math.isfinite(v)) and not math.isnan(v)
    for b in (lo, hi):
        ok = ok and (b is None or ops[b[1]](v, b[0]))
    if ok:
        return None
    return (f"{name} = {clip(repr(value), 30)} is out of range: give "
            f"{range_text(model, name, (units or {}).get(name, ''))}")


def range_text(model: Any, name: str, unit: str = "") -> str:
    """The values field ``name`` of the pydantic model class ``model`` allows, from its
    ``Field`` bounds: ``"a whole number from 1 to 16,384"``, ``"a finite number >= 0"``,
    ``"a number > 0 and <= 1"``; ``unit`` (``"ms"``) follows the kind of number
    (``"a finite number of ms >= 0"``). ``""`` for a field without bounds."""
    import typing

    field = model.model_fields[name]
    lo, hi, finite = _bounds(model, name)
    if lo is None and hi is None:
        return ""
    whole = int in (field.annotation, *typing.get_args(field.annotation))
    kind = "a whole number" if whole else ("a finite number" if finite else "a number")
    kind += f" of {unit}" if unit else ""
    if lo is not None and hi is not None and lo[1] == ">=" and hi[1] == "<=":
        return f"{kind} from {_num(lo[0])} to {_num(hi[0])}"
    parts = [f"{b[1]} {_num(b[0])}" for b in (lo, hi) if b is not None]
    return f"{kind} {' and '.join(parts)}"


def range_error(err: Any, model: Any, units: dict[str, str] | None = None) -> str | None:
    """For a pydantic error of a bound broken (:data:`RANGE_ERRORS`) on a field of
    ``model``: ``"KEY = VALUE is out of range: give RANGE"`` (:func:`range_text`, in the
    unit ``units`` gives the key, if any); None for any other error."""
    from schedsim.util.text import clip

    loc = tuple(err["loc"])
    if err["type"] not in RANGE_ERRORS or len(loc) != 1 or loc[0] not in model.model_fields:
        return None
    name = str(loc[0])
    allowed = range_text(model, name, (units or {}).get(name, ""))
    if not allowed:
        return None
    return f"{name} = {clip(repr(err['input']), 30)} is out of range: give {allowed}"
