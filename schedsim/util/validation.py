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
