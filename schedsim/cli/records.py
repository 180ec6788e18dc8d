"""A typer command whose options are one record: :func:`options_record` turns a
command ``fn(o: Options)`` taking a frozen dataclass into the callback typer reads.

Each field of the record is declared as a typer parameter would be (its annotation the
``Annotated[..., typer.Option(...)]`` or ``typer.Argument``, its default the option's
default), in the order the options show in ``--help``. The decorator builds the
callback's signature from the fields (``inspect.Parameter``, keyword-only: typer reads
names, annotations and defaults, not the kind), so the flags, ``--help`` text, defaults
and behaviour are those of the same parameters written out one by one; the call builds
the record from typer's values and passes it. Other parameters of ``fn`` stay
parameters of the command. Works under :func:`schedsim.cli.common.handle_errors`
(which adds ``--format``, ``--max`` and ``--version`` to the signature it sees).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable

_KW = inspect.Parameter.KEYWORD_ONLY


def record_parameters(record: type) -> list[inspect.Parameter]:
    """The typer parameters of a dataclass ``record``'s fields, in field order (its
    annotations resolved with their ``Annotated`` metadata); a field without a default
    is a required option."""
    hints = typing.get_type_hints(record, include_extras=True)
    empty = inspect.Parameter.empty
    return [inspect.Parameter(f.name, _KW, annotation=hints[f.name],
                              default=empty if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(record)]


def param_hints(fn: Callable, skip: tuple[str, ...] = ("sc",)) -> dict[str, Any]:
    """The evaluated annotations of ``fn``'s parameters but those in ``skip`` (``sc``:
    the scenario :func:`~schedsim.cli.common.scenario_command` passes, whose type is
    imported only where a command runs, so that the start-up stays light)."""
    own = {k: v for k, v in fn.__annotations__.items() if k not in (*skip, "return")}
    holder = type("_Params", (), {"__annotations__": own})
    return typing.get_type_hints(holder, globalns=fn.__globals__, include_extras=True)


def options_record(record: type, name: str = "o") -> Callable[[Callable], Callable]:
    """Decorator: ``fn(..., o: record, ...)`` as a typer callback whose parameters are
    ``fn``'s with ``o`` (``name``) replaced by the fields of ``record``
    (:func:`record_parameters`, keyword-only). Use it below ``@app.command`` and
    ``@handle_errors`` (and below ``@scenario_command``, whose ``sc`` stays first)."""
    fields = record_parameters(record)
    names = [p.name for p in fields]

    def decorate(fn: Callable) -> Callable:
        hints = param_hints(fn, ("sc", name))
        params: list[inspect.Parameter] = []
        for n, p in inspect.signature(fn).parameters.items():
            if n == name:
                params += fields
            else:
                params.append(p.replace(annotation=hints.get(n, p.annotation),
                                        kind=_KW if params and params[-1].kind == _KW
                                        else p.kind))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            rec = record(**{n: kw.pop(n) for n in names})
            return fn(*args, **{name: rec}, **kw)

        sig = inspect.Signature(params)
        wrapper.__signature__ = sig  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in sig.parameters.values()}
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        return wrapper

    return decorate
