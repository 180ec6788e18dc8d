"""Where a plan's candidates are simulated: this process, local worker processes, or a
Dask distributed cluster.

Every executor has one method that matters, :meth:`Executor.map_unordered`: run a
picklable function over a list of items and yield ``(index, result)`` as each finishes
(any order). The planner sorts what comes back, so the ranking does not depend on the
executor, the worker count or the finishing order.

- :class:`LocalExecutor` (``--executor local``, the default): ``jobs`` worker processes
  (:class:`concurrent.futures.ProcessPoolExecutor`), or this process for ``jobs=1``.
- :class:`DaskExecutor` (``--executor dask``): a ``distributed.Client`` on the scheduler
  at ``address`` (``tcp://host:8786``), or, without one, a ``LocalCluster`` of ``jobs``
  single-threaded worker processes started here and stopped at the end. Results come
  back through the client as each task finishes (``distributed.as_completed``). Why Dask
  rather than Ray: ``docs/plan.md``.

An executor is a context manager: leaving it (normally, on an error or on Ctrl-C) stops
the workers it started and cancels what has not run.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

from schedsim.errors import ScenarioError

EXECUTORS = ("local", "dask")


class Executor:
    """Base: runs in this process."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = jobs

    @property
    def workers(self) -> int:
        return self.jobs

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]:
        """``(index, fn(items[index]))`` for every item, as each finishes."""
        for i, it in enumerate(items):
            yield i, fn(it)


class LocalExecutor(Executor):
    """``jobs`` local worker processes (1: this process)."""

    def __init__(self, jobs: int = 1) -> None:
        super().__init__(jobs)
        self._pool: Any = None

    def _get(self) -> Any:
        if self._pool is None:
            from schedsim.util.signals import quiet_pool

            self._pool = quiet_pool(self.jobs)   # a stop is reported once, by the parent
        return self._pool

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and self._pool is not None:    # a stop or an error: at once
            from schedsim.util.signals import terminate_pool

            pool, self._pool = self._pool, None
            terminate_pool(pool)
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]:
        if self.jobs <= 1 or len(items) <= 1:
            yield from super().map_unordered(fn, items)
            return
        from concurrent.futures import as_completed

        pool = self._get()
        futs = {pool.submit(fn, it): i for i, it in enumerate(items)}
        try:
            for f in as_completed(futs):
                yield futs[f], f.result()
        finally:
            for f in futs:
                f.cancel()


def _distributed() -> Any:
    """The ``distributed`` module, or :class:`ScenarioError` saying how to install it."""
    try:
        import distributed
    except ImportError:
        from schedsim.util.install import install_hint

        raise ScenarioError("--executor dask needs Dask distributed (the 'cluster' extra): "
                            + install_hint("cluster", "'dask[distributed]'")) from None
    return distributed


class DaskExecutor(Executor):
    """A Dask distributed cluster: the scheduler at ``address``, or a local cluster of
    ``jobs`` worker processes (one thread each) started on entry and stopped on exit.

    Raises :class:`ScenarioError` when Dask is not installed or the scheduler cannot be
    reached within ``timeout`` seconds.
    """

    name = "dask"

    def __init__(self, jobs: int = 2, address: str | None = None,
                 timeout: float = 30.0) -> None:
        super().__init__(jobs)
        self.address = address
        self.timeout = timeout
        self._client: Any = None
        self._cluster: Any = None

    def __enter__(self) -> "DaskExecutor":
        distributed = _distributed()
        import logging

        try:
            if self.address is None:
                self._cluster = distributed.LocalCluster(
                    n_workers=self.jobs, threads_per_worker=1, processes=True,
                    dashboard_address=None, silence_logs=logging.ERROR)
                self._client = distributed.Client(self._cluster, timeout=self.timeout)
            else:
                self._client = distributed.Client(self.address, timeout=self.timeout)
        except (OSError, TimeoutError) as e:
            self.close()
            where = self.address or "a local cluster"
            raise ScenarioError(f"--executor dask: cannot reach {where}: {e}; check "
                                f"--address (tcp://HOST:8786) and that the scheduler "
                                f"runs") from None
        return self

    @property
    def workers(self) -> int:
        if self._client is None:
            return self.jobs
        return max(1, len(self._client.scheduler_info().get("workers", {})))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]:
        distributed = _distributed()
        futs = self._client.map(fn, list(items), pure=False)
        index = {f.key: i for i, f in enumerate(futs)}
        try:
            for f in distributed.as_completed(futs):
                yield index[f.key], f.result()
        finally:
            self._client.cancel(futs)


def make_executor(name: str, jobs: int | None = None, address: str | None = None
                  ) -> Executor:
    """The executor ``name`` (:data:`EXECUTORS`) with ``jobs`` workers (None: the CPUs of
    this machine, at least 2 for a local Dask cluster). Raises :class:`ScenarioError` for
    an unknown name, ``jobs`` outside 1..256 or ``--address`` with the local executor."""
    if name not in EXECUTORS:
        from schedsim.util.suggest import did_you_mean

        raise ScenarioError(f"unknown --executor {name!r}{did_you_mean(name, EXECUTORS)}: "
                            f"expected {' or '.join(EXECUTORS)}")
    if jobs is not None:
        from schedsim.util.limits import check_workers

        check_workers("-j", jobs)
    if name == "local":
        if address is not None:
            raise ScenarioError("--address is for --executor dask (the scheduler's "
                                "tcp://HOST:PORT)")
        return LocalExecutor(jobs or (os.cpu_count() or 1))
    _distributed()
    return DaskExecutor(jobs or max(2, os.cpu_count() or 1), address)
