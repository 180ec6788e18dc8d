"""Which executor runs a kernel (:mod:`schedsim.sim.kernels`,
:mod:`schedsim.sim.compile_kernel`, :mod:`schedsim.program.lower_kernel`: the modules
:mod:`schedsim.sim.fast` lists): CPython over lists, or numba over numpy arrays. A kernel
module is compiled as a whole, on its first kernel's use (each function of it, its helpers
inlined); this module knows no kernel module, so that every layer can run its kernels.

numba (``pip install schedsim[fast]``) is optional: it is imported only when a program is
large enough for its compiled loops to pay for the import (about 0.3 s) and the loading
of the cached machine code (compiled once per machine into numba's on-disk cache).
Both executors run the same source and give identical results (the tests compare them on
random programs). ``SCHEDSIM_ENGINE`` chooses: ``auto`` (default: numba when it is
importable and the program has :data:`THRESHOLD` instructions or more, or the compiled
kernels of a module are loaded in this process already, e.g. by
:func:`schedsim.sim.simulate.warm_up`), ``python`` or
``numba`` (always, an error if numba is missing). A process that simulates many small
programs (a schedule search, a benchmark) calls ``warm_up()`` once.
"""
from __future__ import annotations

import os
import sys
from types import FunctionType, SimpleNamespace
from typing import Any

import numpy as np

from schedsim.errors import ScenarioError

#: programs with at least this many instructions run on numba when it is installed
THRESHOLD = 20_000

#: kernel module name -> its functions compiled by numba (filled on first use)
_JITTED: dict[str, SimpleNamespace] = {}
_AVAILABLE: bool | None = None


class _Lists:
    """Allocation and conversion for the CPython executor (Python lists)."""

    @staticmethod
    def full(n: int, v: int, dtype: type = np.int64) -> list:
        """``n`` copies of ``v`` (``dtype``: the array's type under numba)."""
        return [v] * n

    @staticmethod
    def fullf(n: int, v: float) -> list:
        return [float(v)] * n

    @staticmethod
    def empty(n: int, dtype: type = np.int64) -> list:
        """Scratch or output the kernel writes before reading."""
        return [0] * n

    @staticmethod
    def emptyf(n: int) -> list:
        return [0.0] * n

    @staticmethod
    def ints(a: Any) -> list:
        return np.asarray(a).tolist()

    floats = ints
    new_ints = ints

    @staticmethod
    def record(rec: Any, unread: tuple[str, ...] = ()) -> Any:
        """A read-only input record (a named tuple) with its arrays as lists; the fields
        ``unread`` (the kernel does not read them) empty instead (converting them would
        cost time, ~30 ms per million)."""
        return type(rec)(*(() if f in unread else v.tolist() if isinstance(v, np.ndarray)
                           else v for f, v in zip(rec._fields, rec)))


class _Arrays:
    """Allocation and conversion for the numba executor (contiguous numpy arrays)."""

    @staticmethod
    def full(n: int, v: int, dtype: type = np.int64) -> np.ndarray:
        """``n`` copies of ``v``; zeros from ``np.zeros``: a large block's pages are then
        zeroed by the system on first touch only, so that the parts a kernel never
        writes (``unit_hptr`` without comm streams) cost nothing."""
        return np.zeros(n, dtype=dtype) if v == 0 else np.full(n, v, dtype=dtype)

    @staticmethod
    def fullf(n: int, v: float) -> np.ndarray:
        return np.full(n, v, dtype=np.float64)

    @staticmethod
    def empty(n: int, dtype: type = np.int64) -> np.ndarray:
        """Scratch or output the kernel writes before reading."""
        return np.empty(n, dtype=dtype)

    @staticmethod
    def emptyf(n: int) -> np.ndarray:
        return np.empty(n, dtype=np.float64)

    @staticmethod
    def ints(a: Any) -> np.ndarray:
        """Read-only input: int8 (flags), int32 and int64 arrays pass as they are (no
        copy)."""
        a = np.asarray(a)
        if a.dtype == np.int32 or a.dtype == np.int64 or a.dtype == np.int8:
            return np.ascontiguousarray(a)
        return np.ascontiguousarray(a, dtype=np.int64)

    @staticmethod
    def floats(a: Any) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float64)

    @staticmethod
    def new_ints(a: Any) -> np.ndarray:
        """A writable copy (for outputs initialised from data)."""
        return np.array(a, dtype=np.int64)

    @staticmethod
    def record(rec: Any, unread: tuple[str, ...] = ()) -> Any:
        """A read-only input record (a named tuple) with its arrays contiguous: floats as
        float64, integers and flags as :meth:`ints` (no copy when they are already);
        ``unread`` is for :meth:`_Lists.record` (passing an array costs nothing here)."""
        return type(rec)(*(_Arrays.floats(v) if isinstance(v, np.ndarray) and v.dtype.kind
                           == "f" else _Arrays.ints(v) if isinstance(v, np.ndarray) else v
                           for v in rec))


def numba_available() -> bool:
    """True if numba can be imported (checked once)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            import numba  # noqa: F401
            _AVAILABLE = True
        except ImportError:
            _AVAILABLE = False
    return _AVAILABLE


def choice() -> str:
    """The ``SCHEDSIM_ENGINE`` setting: ``auto``, ``python`` or ``numba``."""
    v = os.environ.get("SCHEDSIM_ENGINE", "auto").strip().lower() or "auto"
    if v not in ("auto", "python", "numba"):
        raise ScenarioError(f"SCHEDSIM_ENGINE={v!r}: expected auto, python or numba")
    return v


def use_numba(n: int) -> bool:
    """Whether a program of ``n`` instructions runs on numba."""
    c = choice()
    if c == "python":
        return False
    if c == "numba":
        if not numba_available():
            raise ScenarioError("SCHEDSIM_ENGINE=numba but numba is not installed: pip "
                                "install 'schedsim[fast]' (or unset SCHEDSIM_ENGINE)")
        return True
    return (n >= THRESHOLD or bool(_JITTED)) and numba_available()


def _functions(module: Any) -> dict[str, FunctionType]:
    return {n: f for n, f in vars(module).items()
            if isinstance(f, FunctionType) and f.__module__ == module.__name__}


def jitted_module(module: Any) -> SimpleNamespace:
    """The functions of kernel module ``module`` compiled by numba, by name (cached on
    disk; compiled on first use)."""
    done = _JITTED.get(module.__name__)
    if done is None:
        import numba

        out: dict[str, Any] = {}
        # numba resolves the functions a kernel calls through its globals: give the
        # module's kernels a namespace in which those names are the compiled versions;
        # helpers (``_name``) are inlined into their callers by numba (no call, no
        # reference counting of their array arguments)
        ns = dict(vars(module))
        for name, fn in _functions(module).items():
            f = FunctionType(fn.__code__, ns, name, fn.__defaults__)
            f.__qualname__ = fn.__qualname__
            f.__module__ = fn.__module__
            inline = "always" if name.startswith("_") else "never"
            ns[name] = out[name] = numba.njit(cache=True, nogil=True, inline=inline)(f)
        done = _JITTED[module.__name__] = SimpleNamespace(**out)
    return done


def executor(kernel: FunctionType, n: int) -> tuple[Any, Any]:
    """``(function, allocator)`` that runs ``kernel`` (a kernel function of a kernel
    module, e.g. :func:`schedsim.sim.kernels.run_kernel`, passed by name)
    for a program of ``n`` instructions: its numba-compiled version with numpy arrays,
    or the function itself with Python lists. Raises :class:`ScenarioError` as
    :func:`use_numba`."""
    if use_numba(n):
        return getattr(jitted_module(sys.modules[kernel.__module__]), kernel.__name__), \
            _Arrays
    return kernel, _Lists
