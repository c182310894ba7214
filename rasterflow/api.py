"""The Python API: ``load_spec -> plan -> run``, for Airflow / Prefect / Dagster tasks and notebooks.

Nothing here prints or exits. Errors are raised as :class:`~rasterflow.errors.RasterflowError` subclasses (each also
the matching built-in: ``SpecError`` is a ``ValueError``, ``BudgetExceededError`` a ``MemoryError``...); a run that
was stopped by a signal raises :class:`~rasterflow.errors.RunInterrupted` (a ``KeyboardInterrupt``). Either way the
run report was written first, and ``err.result`` holds the :class:`~rasterflow.run.RunResult`.

Light to import: the pixel libraries load inside :func:`run`.

>>> import rasterflow
>>> loaded = rasterflow.load_spec("pipelines/demo.yaml", variables={"OUT": "/data"})   # doctest: +SKIP
>>> job = rasterflow.plan(loaded)                                                      # doctest: +SKIP
>>> result = rasterflow.run(loaded)                                                    # doctest: +SKIP
>>> result.status, result.outputs, result.report_path                                  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.plan import JobPlan
    from rasterflow.run import RunResult
    from rasterflow.spec.loader import LoadedSpec

__all__ = ["load_spec", "plan", "run"]


def load_spec(path: str | os.PathLike, *, variables: Mapping[str, str] | None = None,
              environ: Mapping[str, str] | None = None) -> LoadedSpec:
    """Read and validate a spec file (``${VAR}`` from ``variables``, then ``environ``, default the environment).

    Raises
    ------
    SpecError
        Every problem found, each as ``file:line:col: field: message``.
    """
    from rasterflow.spec.loader import load_spec as _load

    return _load(path, variables=variables, environ=environ)


def _loaded(spec: Any, variables: Mapping[str, str] | None) -> LoadedSpec:
    from rasterflow.spec.loader import LoadedSpec

    if isinstance(spec, LoadedSpec):
        if variables:
            return load_spec(spec.path, variables=variables)
        return spec
    return load_spec(spec, variables=variables)


def plan(spec: Any, *, variables: Mapping[str, str] | None = None, now: dt.datetime | None = None) -> JobPlan:
    """Search the catalog (metadata only) and resolve the job: grid, chunks, items, the memory budget's verdict.

    ``plan(...).report.ok`` says whether the budget lets it run; nothing is computed.

    Raises
    ------
    SpecError, CatalogError, NoItemsFoundError, ClusterError
    """
    from rasterflow.run import plan_command

    return plan_command(_loaded(spec, variables), now=now).plan


def run(spec: Any, *, variables: Mapping[str, str] | None = None, overwrite: bool = False,
        report_path: str | os.PathLike | None = None, progress: bool = False,
        on_event: Callable[[str, dict], None] | None = None, handle_signals: bool = False,
        state_dir: str | os.PathLike | None = None, now: dt.datetime | None = None) -> RunResult:
    """Plan, check, compute and write one spec; returns the :class:`~rasterflow.run.RunResult`.

    Parameters
    ----------
    spec : LoadedSpec or path
    variables : mapping, optional
        ``${VAR}`` values (a loaded spec is reloaded with them).
    overwrite : bool
        As ``--overwrite``: replace the output (only ever a rasterflow output).
    report_path : path, optional
        Where the run report goes (default ``<output>.report.json`` when this run owns the output).
    progress : bool
        Show block progress on stdout.
    on_event : callable, optional
        ``on_event(kind, fields)`` for warnings, progress milestones, the dashboard link... (see ``rasterflow.run``).
    handle_signals : bool
        Install SIGINT/SIGTERM/SIGHUP handlers for the run (main thread only) so a stop is clean and reported; off
        by default, because a library must not take over its host's signals.
    state_dir : path, optional
        Where reports of runs that do not own their output go (default ``.rasterflow``).

    Returns
    -------
    RunResult
        ``status`` ``ok`` or ``up_to_date`` (anything else raises).

    Raises
    ------
    RasterflowError
        ``SpecError``, ``BudgetExceededError``, ``OutputExistsError``, ``OutputLockedError``, ``RunFailedError``...;
        ``err.result`` is the run's result (with its report).
    RunInterrupted
        A signal stopped the run (``err.result.status == "interrupted"``).
    """
    import sys

    from rasterflow.run import DEFAULT_STATE_DIR, run_command
    from rasterflow.signals import Interrupts

    loaded = _loaded(spec, variables)
    interrupts = Interrupts()
    if handle_signals:
        interrupts.install()
    try:
        result = run_command(loaded, report_path=Path(report_path) if report_path else None, overwrite=overwrite,
                             emit=on_event, progress_stream=sys.stdout if progress else None, interrupts=interrupts,
                             state_dir=state_dir or DEFAULT_STATE_DIR, now=now)
    finally:
        interrupts.restore()
    if result.exception is not None and result.exit_code != 0:
        err = result.exception
        try:
            err.result = result  # type: ignore[attr-defined]
        except AttributeError:  # pragma: no cover - a built-in without a __dict__
            pass
        raise err
    return result
