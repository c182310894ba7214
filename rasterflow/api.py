"""The Python API: ``load_spec -> plan -> run``, for Airflow / Prefect / Dagster tasks and notebooks.

Nothing here prints or exits. Errors are raised as :class:`~rasterflow.errors.RasterflowError` subclasses (each also
the matching built-in: ``SpecError`` is a ``ValueError``, ``BudgetExceededError`` a ``MemoryError``...); a run that
was stopped by a signal raises :class:`~rasterflow.errors.RunInterrupted` (a ``KeyboardInterrupt``). Either way the
run report was written first, and ``err.result`` holds the :class:`~rasterflow.commands.RunResult`.

Light to import: the pixel libraries load inside :func:`run`.

>>> import rasterflow
>>> loaded = rasterflow.load_spec("pipelines/demo.yaml", variables={"OUT": "/data"})   # doctest: +SKIP
>>> job = rasterflow.plan(loaded)                                                      # doctest: +SKIP
>>> result = rasterflow.run(loaded)                                                    # doctest: +SKIP
>>> result.status, result.outputs, result.report_path                                  # doctest: +SKIP
>>> ds = rasterflow.open(loaded)            # the same job as a lazy xarray Dataset       # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan
    from rasterflow.commands import RunResult
    from rasterflow.spec.loader import LoadedSpec
    from rasterflow.spec.models import Spec


__all__ = ["load_spec", "plan", "run", "open"]


DICT_SPEC_NAME = "<spec dict>"
"""How a spec given as a mapping (or a :class:`~rasterflow.spec.models.Spec`) is named in messages; its relative
paths are relative to the working directory."""


def load_spec(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec, *, variables: Mapping[str, str] | None = None,
              environ: Mapping[str, str] | None = None) -> LoadedSpec:
    """Read and validate a spec (``${VAR}`` from ``variables``, then ``environ``, default the environment).

    ``spec`` is a spec file's path, or the spec itself as a mapping (the YAML's content, e.g. built in an Airflow
    task) or a :class:`~rasterflow.spec.models.Spec`; a mapping's relative paths are relative to the working
    directory and its problems are named by field (``<spec dict>: grid.crs: ...``), there being no line to show.

    Raises
    ------
    SpecError
        Every problem found, each as ``file:line:col: field: message``.
    """
    from rasterflow.errors import SpecError
    from rasterflow.spec.loader import load_spec as _load
    from rasterflow.spec.models import Spec

    if isinstance(spec, Spec):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    if isinstance(spec, Mapping):
        return _load_mapping(spec, variables=variables, environ=environ)
    if not isinstance(spec, (str, os.PathLike)):
        raise SpecError(f"a spec is a path to a YAML file, a mapping or a rasterflow Spec, not "
                        f"{type(spec).__name__}")
    return _load(spec, variables=variables, environ=environ)


def _load_mapping(data: Mapping[str, Any], *, variables: Mapping[str, str] | None,
                  environ: Mapping[str, str] | None) -> LoadedSpec:
    """A spec given as a mapping: its YAML text validated as a file would be, positions dropped (they would be the
    lines of a text the user never saw)."""
    import dataclasses
    import json

    import yaml

    from rasterflow.errors import SpecError, SpecIssue
    from rasterflow.spec.loader import load_spec_text

    try:
        # through JSON: tuples, Paths and other plain values become what YAML can say
        text = yaml.safe_dump(json.loads(json.dumps(dict(data), default=str)), sort_keys=False)
    except (TypeError, ValueError) as err:
        raise SpecError(f"{DICT_SPEC_NAME}: the spec mapping cannot be written as YAML: {err}") from None
    try:
        loaded = load_spec_text(text, path=DICT_SPEC_NAME, variables=variables, environ=environ)
    except SpecError as err:
        raise SpecError([SpecIssue(i.path, None, None, i.field, i.message) for i in err.issues]) from None
    positions = dataclasses.replace(loaded.positions, key_positions={}, value_positions={})
    return dataclasses.replace(loaded, positions=positions)


def _loaded(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec | LoadedSpec, variables: Mapping[str, str] | None) -> LoadedSpec:
    from rasterflow.spec.loader import LoadedSpec

    if isinstance(spec, LoadedSpec):
        if variables:
            if str(spec.path) == DICT_SPEC_NAME:
                raise_variables_need_source()
            return load_spec(spec.path, variables=variables)
        return spec
    return load_spec(spec, variables=variables)


def raise_variables_need_source() -> None:
    from rasterflow.errors import SpecError

    raise SpecError(f"{DICT_SPEC_NAME}: variables apply when the spec is loaded: pass the mapping itself (with "
                    f"variables=...) instead of its LoadedSpec")


def plan(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec | LoadedSpec, *, variables: Mapping[str, str] | None = None, now: dt.datetime | None = None) -> JobPlan:
    """Search the catalog (metadata only) and resolve the job: grid, chunks, items, the memory budget's verdict.

    ``plan(...).report.ok`` says whether the budget lets it run; nothing is computed.

    Raises
    ------
    SpecError, CatalogError, NoItemsFoundError, ClusterError
    """
    from rasterflow.commands import plan_command

    return plan_command(_loaded(spec, variables), now=now).plan


def run(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec | LoadedSpec, *, variables: Mapping[str, str] | None = None, overwrite: bool = False,
        report_path: str | os.PathLike[str] | None = None, progress: bool = False,
        on_event: Callable[[str, dict[str, Any]], None] | None = None, handle_signals: bool = False,
        state_dir: str | os.PathLike[str] | None = None, now: dt.datetime | None = None) -> RunResult:
    """Plan, check, compute and write one spec; returns the :class:`~rasterflow.commands.RunResult`.

    Parameters
    ----------
    spec : LoadedSpec, path, mapping or Spec
        A spec file, or the spec as a mapping / :class:`~rasterflow.spec.models.Spec` (see :func:`load_spec`).
    variables : mapping, optional
        ``${VAR}`` values (a loaded spec is reloaded with them).
    overwrite : bool
        As ``--overwrite``: replace the output (only ever a rasterflow output).
    report_path : path, optional
        Where the run report goes (default ``<output>.report.json`` when this run owns the output).
    progress : bool
        Show block progress on stdout.
    on_event : callable, optional
        ``on_event(kind, fields)`` for warnings, progress milestones, the dashboard link... (see ``rasterflow.commands``).
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

    from rasterflow.commands import DEFAULT_STATE_DIR, run_command
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


def open(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec | LoadedSpec, *, variables: Mapping[str, str] | None = None,  # noqa: A001 - rasterflow.open, as xr.open_*
         now: dt.datetime | None = None) -> Any:
    """The planned job as a lazy :class:`xarray.Dataset` backed by Dask: nothing is read until it is computed.

    The same plan, read path and tasks as :func:`run` (each chunk's task reads its items with the run's read
    policy), the same variables, coordinates and attributes as the written output. Select first, then compute:
    ``ds.isel(time=0).compute()`` or ``ds.sel(x=slice(...), y=slice(...)).compute()`` runs only the chunks
    needed, with Dask's current scheduler (threads by default, or a ``distributed.Client`` you started).

    Parameters
    ----------
    spec : path, mapping, Spec or LoadedSpec
        As :func:`load_spec` takes it.
    variables : mapping, optional
        ``${VAR}`` values.
    now : datetime, optional
        The time a relative window ends at (default: now).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    SpecError, CatalogError, NoItemsFoundError
        As :func:`plan`. A plan the budget refuses is still opened (a selection may well fit), with a
        ``ResourceWarning`` that says so.
    """
    import warnings

    from rasterflow import graph
    from rasterflow.budget import verdict_line
    from rasterflow.commands import output_options, plan_command

    job = plan_command(_loaded(spec, variables), now=now).plan
    if not job.report.ok:
        warnings.warn(f"the budget check refuses the whole job ({verdict_line(job.report)}); computing all of it at once "
                      "may run out of memory: select a part first", ResourceWarning, stacklevel=2)
    dataset = graph.build_dataset(job)
    _description, _encoding, options = output_options(job, job.output.path)
    dataset.attrs.update(options["metadata"])
    return dataset

