"""The kernel modules and their loading: :data:`KERNEL_MODULES` lists every module whose
functions are kernels (written once for CPython and numba), :func:`jitted` compiles them
all (what :func:`schedsim.sim.simulate.warm_up` loads). Which executor runs a kernel, and
the ``SCHEDSIM_ENGINE`` setting, are :mod:`schedsim.util.jit`'s (re-exported here)."""
from __future__ import annotations

from types import SimpleNamespace

from schedsim.program import lower_kernel
from schedsim.sim import compile_kernel, kernels, prep_kernel
from schedsim.util.jit import (  # noqa: F401  (this layer's names for them)
    THRESHOLD,
    choice,
    executor,
    jitted_module,
    numba_available,
    use_numba,
)

#: the modules whose functions are kernels (and the helpers they call)
KERNEL_MODULES = (kernels, compile_kernel, lower_kernel, prep_kernel)


def jitted() -> SimpleNamespace:
    """Every kernel of :data:`KERNEL_MODULES` compiled by numba, by name (cached on disk;
    compiled on first use)."""
    out: dict = {}
    for module in KERNEL_MODULES:
        out.update(vars(jitted_module(module)))
    return SimpleNamespace(**out)
