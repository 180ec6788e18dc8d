"""typer's option coercion without a pydantic ``TypeAdapter`` per option for the plain
values a command line gives (installed once by :mod:`schedsim.cli`).

typer 0.29 coerces every option's value, a default included, through a pydantic
``TypeAdapter`` built for that option the first time it is read (``typer/_coercion.py``,
``build_runtime_param``; ``typer/_adapters.py``, ``build_leaf_adapter``): a small
``simulate`` built 38 of them, a third of its start-up. Here each option gets a
:class:`FastRuntimeParam` instead: the values whose result is certain (an ``int`` that
is all digits and in the option's range, a ``str``, a plain decimal ``float``, a path
that passes typer's own checks, lists of those) are converted as the adapter converts
them (``tests/test_cli_coercion.py`` checks the two agree); every other value, and every
value the fast rule would refuse, goes to typer's own coercion (its adapter built then),
so that a bad value's message is typer's, word for word. Leaves typer alone when its
internals are not the expected ones.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

#: a decimal integer as pydantic reads one from a string (a shorter, digits-only subset:
#: no sign ``+``, spaces or ``_``; at most 18 digits, so no length limit applies)
_INT = re.compile(r"-?[0-9]{1,18}")
#: a decimal float without an exponent (a subset of what pydantic reads)
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{0,15})?")


class _Unsure(Exception):
    """The fast rule cannot tell this value's result: typer's coercion decides."""


def _in_range(v: Any, info: Any) -> Any:
    """``v`` when it is within the option's ``min``/``max`` (no ``clamp``), else unsure."""
    if info.clamp or (info.min is not None and v < info.min) or (
            info.max is not None and v > info.max):
        raise _Unsure
    return v


def _leaf(ann: Any, value: Any, info: Any, param: Any, ctx: Any) -> Any:
    """One value of type ``ann`` (``int``, ``float``, ``str``, ``Path``) as typer's
    adapter returns it. Raises :class:`_Unsure` for anything else."""
    if info.parser is not None:
        raise _Unsure
    kind = type(value)
    if ann is str and kind is str:
        return value
    if ann is int:
        if kind is int:
            return _in_range(value, info)
        if kind is str and _INT.fullmatch(value):
            return _in_range(int(value), info)
    elif ann is float:
        if kind is float or kind is int:
            return _in_range(float(value), info)
        if kind is str and _FLOAT.fullmatch(value):
            return _in_range(float(value), info)
    elif ann is Path and info.path_type is None and not info.resolve_path:
        if kind is str and value and "\0" not in value:
            from typer._click.exceptions import BadParameter
            from typer._param_types import coerce_cli_path

            try:        # typer's own checks (file/dir, readable, ...), on the Path
                return coerce_cli_path(Path(value), info, path_type=Path, param=param,
                                       ctx=ctx)
            except BadParameter:    # typer's adapter words the refusal
                raise _Unsure from None
    raise _Unsure


def fast_value(ann: Any, value: Any, info: Any, param: Any = None, ctx: Any = None
               ) -> Any:
    """``value`` of an option annotated ``ann`` (typer's resolved annotation: ``int``,
    ``float``, ``str``, ``Path`` or a ``list`` of one) with typer's ``ParameterInfo``
    ``info``, as typer's adapter coerces it. Raises :class:`_Unsure` where the fast rule
    cannot tell (typer's coercion then runs)."""
    if get_origin(ann) is list:
        (item,) = get_args(ann)
        if not isinstance(value, (list, tuple)):
            raise _Unsure
        return [_leaf(item, v, info, param, ctx) for v in value]
    return _leaf(ann, value, info, param, ctx)


def install() -> None:
    """Make typer's parameters coerce through :class:`FastRuntimeParam` (once)."""
    try:
        from typer import _coercion, core
    except ImportError:  # pragma: no cover
        return
    base = getattr(_coercion, "RuntimeParam", None)
    build = getattr(core, "build_runtime_param", None)
    if base is None or build is None or getattr(build, "_schedsim", False):
        return

    @dataclass(frozen=True)
    class FastRuntimeParam(base):      # type: ignore[misc, valid-type]
        """One option's coercion: :func:`fast_value`, else typer's (built on demand)."""

        descriptor: Any = None
        typer_param: list = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return fast_value(self.annotation, value, self.parameter_info, param, ctx)
            except _Unsure:
                pass
            if not self.typer_param:
                self.typer_param.append(build(self.descriptor))
            return self.typer_param[0]._coerce_value(value, param=param, ctx=ctx)

    def build_runtime_param(descriptor: Any) -> Any:
        if descriptor.file_annotation is not None:
            return build(descriptor)
        return FastRuntimeParam(annotation=descriptor.annotation,
                                parameter_info=descriptor.parameter_info,
                                descriptor=descriptor)

    build_runtime_param._schedsim = True        # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param
