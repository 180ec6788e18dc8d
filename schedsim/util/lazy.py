"""Pydantic models whose big list fields are built on first access.

A timeline of a million instructions holds its rows as arrays; the object lists
(``Timeline.spans``, ``messages``, ``waits``) cost more to build than the simulation
itself, and many callers never read them (a summary table, a search over
makespans). :class:`LazyFields` lets a model be created without those fields and builds
them, all at once, the first time one is read, serialized, compared, copied or pickled.
Everything else about the model is unchanged.
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_serializer


class LazyFields(BaseModel):
    """Mixin: the fields named in ``_lazy_fields`` may be left unset by
    :meth:`_defer` and are then filled by the subclass's :meth:`_build_lazy` (which
    returns ``{field: value}``) on first use."""

    model_config = ConfigDict(defer_build=True)

    _lazy_fields: ClassVar[tuple[str, ...]] = ()
    _lazy: Any = PrivateAttr(default=None)

    def _defer(self, state: Any) -> None:
        """Drop the lazy fields; ``state`` is what :meth:`_build_lazy` will need."""
        for name in self._lazy_fields:
            self.__dict__.pop(name, None)
        self._lazy = state

    def _build_lazy(self, state: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _after_build(self) -> None:
        """Called once the lazy fields are built (subclasses may drop state)."""

    @property
    def is_deferred(self) -> bool:
        """True while the lazy fields are not built yet."""
        return self._lazy_fields[0] not in self.__dict__ if self._lazy_fields else False

    def _ensure(self) -> None:
        if self._lazy_fields and self._lazy_fields[0] not in self.__dict__:
            priv = self.__pydantic_private__
            state = priv.get("_lazy") if priv else None
            if state is not None:
                built = self._build_lazy(state)
                d = self.__dict__      # keep the fields in declaration order (JSON order)
                ordered = {k: built[k] if k in built else d[k]
                           for k in type(self).model_fields if k in built or k in d}
                ordered.update((k, v) for k, v in d.items() if k not in ordered)
                d.clear()
                d.update(ordered)
                priv["_lazy"] = None
                self._after_build()

    def __getattr__(self, name: str) -> Any:
        if name in type(self)._lazy_fields:
            priv = self.__pydantic_private__
            if priv and priv.get("_lazy") is not None:
                self._ensure()
                return self.__dict__[name]
        return super().__getattr__(name)  # type: ignore[misc]

    @model_serializer(mode="wrap")
    def _serialize_lazy(self, handler: Any) -> Any:
        self._ensure()
        return handler(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyFields):
            self._ensure()
            other._ensure()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Any:
        self._ensure()
        return super().__iter__()

    def __repr_args__(self) -> Any:
        self._ensure()
        return super().__repr_args__()

    def __copy__(self) -> Any:
        self._ensure()
        return super().__copy__()

    def __deepcopy__(self, memo: dict | None = None) -> Any:
        self._ensure()
        return super().__deepcopy__(memo)

    def __getstate__(self) -> dict[Any, Any]:
        self._ensure()
        return super().__getstate__()

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Any:
        self._ensure()
        return super().model_copy(update=update, deep=deep)
