"""The command line: ``rasterflow validate | plan | run | retry | profile | schema | demo``.

This is the only module that prints and the only one that turns errors into exit codes (README, "Exit codes"):
0 ok (or up to date), 1 run failed, 2 invalid spec, 3 over budget, 64 usage error, 75 output locked by another run,
128 + N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP), 141 stdout closed (``| head``). User mistakes print
a message and no traceback (``--debug`` shows it); anything unexpected is a failed run (exit 1) with a pointer to
``--debug``. The global options (``--debug``, ``-v``, ``-q``, ``--log-format``) work before or after the subcommand.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, ParamSpec, Sequence, TypeVar

import click

from rasterflow import __version__
from rasterflow.errors import ExitCode, RasterflowError, RunInterrupted, SpecError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.commands import RunResult, TextSink
    from rasterflow.planning import JobPlan
    from rasterflow.spec import LoadedSpec

_P = ParamSpec("_P")
_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["main", "cli"]

BROKEN_PIPE = 141
"""Exit code when stdout is closed early (``rasterflow plan spec.yaml | head -3``): 128 + SIGPIPE, as ``yes | head``."""


class _State:
    debug = False
    verbosity = 0
    """-1 quiet, 0 normal, 1 and more verbose."""
    log_format = "text"


def _json_logs() -> bool:
    return _State.log_format == "json"


def _fail(message: str, spec: str | None = None, *, error: BaseException | None = None,
          exit_code: int | None = None) -> None:
    """An error line (red, stderr); in JSON log mode an ``error`` event with the structured fields of
    :func:`rasterflow.logs.error_fields` (type, exit_code, file, line, column, field, issues)."""
    if _json_logs():
        from rasterflow.logs import error_fields, json_event

        json_event("error", spec, message=message, **error_fields(error, exit_code))
        return
    click.secho(message, fg="red", err=True)


def _warn(message: str, spec: str | None = None) -> None:
    if _State.verbosity < 0:
        return
    if _json_logs():
        from rasterflow.logs import json_event

        json_event("warning", spec, message=message)
        return
    click.secho(f"warning: {message}", fg="yellow", err=True)


def _say(message: str = "", *, err: bool = False, min_verbosity: int = 0, **style: Any) -> None:
    """A human line (stdout unless ``err``); dropped with -q (or below ``min_verbosity``) and in JSON log mode."""
    if _State.verbosity < min_verbosity or _json_logs():
        return
    click.secho(message, err=err, **style)


def _quiet_broken_pipe() -> None:
    """stdout was closed by the reader: point it at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (CliRunner)
        pass


def _guarded(func: Callable[_P, int]) -> Callable[_P, NoReturn]:
    """Run a command body; map its return value and errors to the process exit code."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> NoReturn:
        try:
            code = func(*args, **kwargs)
        except BrokenPipeError:
            _quiet_broken_pipe()
            code = BROKEN_PIPE
        except RasterflowError as err:
            if _State.debug:
                raise
            _fail(str(err), error=err)
            code = err.exit_code
        except RunInterrupted as err:
            _fail(f"interrupted by {err.signal_name}", error=err)
            code = err.exit_code
        except KeyboardInterrupt as err:
            _fail("interrupted", error=err, exit_code=130)
            code = 130
        except Exception as err:  # an internal error, not the user's: say so and keep the message
            if _State.debug:
                raise
            _fail(f"internal error: {type(err).__name__}: {err}\n(rerun with --debug for the traceback)", error=err,
                  exit_code=int(ExitCode.RUN_FAILED))
            code = ExitCode.RUN_FAILED
        sys.exit(int(code or 0))

    return wrapper


# --------------------------------------------------------------------------------------------------------------------
# global options: accepted by the group and by every subcommand


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _State.debug = True


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value:
        _State.verbosity = max(_State.verbosity, 0) + value


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _State.verbosity = -1


def _set_log_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        _State.log_format = value


def _global_options(func: _F) -> _F:
    options = [
        click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug,
                     help="Show tracebacks for errors."),
        click.option("-v", "--verbose", count=True, expose_value=False, callback=_set_verbose,
                     help="Say more (repeat for more)."),
        click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_quiet,
                     help="Only errors and the final status."),
        click.option("--log-format", type=click.Choice(["text", "json"]), default=None, expose_value=False,
                     callback=_set_log_format, help="json: one JSON event per line on stderr, for log collectors."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _parse_vars(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--var {value!r}: write --var KEY=VALUE")
        out[key.strip()] = val
    return out


_var_option = click.option("--var", "variables", multiple=True, metavar="KEY=VALUE",
                           help="Set ${KEY} in the specs (over the environment); repeatable.")
_select_option = click.option("--select", "select", multiple=True, metavar="NAME|tag:TAG",
                              help="Only specs with this name (glob allowed) or tag; repeatable.")
_exclude_option = click.option("--exclude", "exclude", multiple=True, metavar="NAME|tag:TAG",
                               help="Leave out specs with this name or tag; repeatable.")
_specs_argument = click.argument("specs", nargs=-1, required=True)


class _Group(click.Group):
    """Usage errors exit 64 (not click's 2, which is rasterflow's "invalid spec")."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            if not standalone_mode:
                raise
            err.show()
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as err:
            if not standalone_mode:
                raise
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            if not standalone_mode:
                raise
            click.echo("Aborted!", err=True)
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rasterflow")
@_global_options
def cli() -> None:
    """rasterflow: declarative raster pipelines on Dask, checked against memory before a pixel is read."""


# --------------------------------------------------------------------------------------------------------------------
# loading several specs


def _load_selected(specs: tuple[str, ...], variables: dict[str, str], select: tuple[str, ...],
                   exclude: tuple[str, ...]) -> tuple[list[LoadedSpec], list[tuple[Path, SpecError]]]:
    """The selected loaded specs, and the specs that failed to load (and are not clearly deselected)."""
    from rasterflow.batch import expand_spec_paths, matches
    from rasterflow.spec import load_spec

    loaded_specs, broken = [], []
    for path in expand_spec_paths(specs):
        try:
            loaded = load_spec(path, variables=variables)
        except SpecError as err:
            if _State.debug:
                raise
            # an unreadable spec has no name or tags: judge by the file's stem, and never drop it silently
            if (select and not matches(path.stem, (), path.stem, select)) or \
                    (exclude and matches(path.stem, (), path.stem, exclude)):
                _warn(f"{path} is not valid and was not selected: {str(err).splitlines()[0]}")
                continue
            broken.append((path, err))
            continue
        name, tags = loaded.spec.name, loaded.spec.tags
        if select and not matches(name, tags, path.stem, select):
            continue
        if exclude and matches(name, tags, path.stem, exclude):
            continue
        loaded_specs.append(loaded)
    if not loaded_specs and not broken:
        what = " ".join([*(f"--select {s}" for s in select), *(f"--exclude {s}" for s in exclude)])
        raise UsageError(f"no spec left to process{' after ' + what if what else ''}")
    return loaded_specs, broken


# --------------------------------------------------------------------------------------------------------------------
# validate


@cli.command()
@_specs_argument
@_var_option
@_select_option
@_exclude_option
@_global_options
@_guarded
def validate(specs: tuple[str, ...], variables: tuple[str, ...], select: tuple[str, ...],
             exclude: tuple[str, ...]) -> int:
    """Parse and validate SPEC files (files, folders, globs) and run the static budget check (no network).

    Exit code: 0 all valid, 2 some invalid, 3 some over budget (the highest code of all files).
    """
    loaded_specs, broken = _load_selected(specs, _parse_vars(variables), select, exclude)
    worst = ExitCode.OK
    for _path, err in broken:
        _fail(str(err), error=err)
        worst = max(worst, err.exit_code)
    for loaded in loaded_specs:
        try:
            verdict = _static_budget_line(loaded)
        except RasterflowError as err:
            _fail(str(err), error=err)
            worst = max(worst, err.exit_code)
            continue
        click.echo(f"ok   {loaded.path}{verdict}")
    return worst


def _static_budget_line(loaded: LoadedSpec) -> str:
    """Run the static budget check; raises BudgetExceededError when over budget."""
    from rasterflow.planning import static_check

    from rasterflow.budget import verdict_line

    report = static_check(loaded)
    for warning in report.warnings:
        click.secho(f"warn {loaded.path}: {warning}", fg="yellow", err=True)
    if loaded.spec.cluster.address:
        # validate never touches the network: the real workers' limits are checked by plan and run
        return f"  ({verdict_line(report)}; limit sized for this machine, plan checks the cluster's)"
    return f"  ({verdict_line(report)})"


# --------------------------------------------------------------------------------------------------------------------
# plan


def _error_object(err: BaseException, spec: str | None) -> dict[str, Any]:
    code = int(getattr(err, "exit_code", ExitCode.RUN_FAILED)) if isinstance(err, RasterflowError) else 1
    return {"spec": spec, "error": {"type": type(err).__name__, "message": str(err), "exit_code": code}}


@cli.command()
@_specs_argument
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON for scripts (only JSON on stdout).")
@click.option("--fix", is_flag=True, help="Print a corrected chunks/cluster block ready to paste.")
@_var_option
@_select_option
@_exclude_option
@_global_options
@_guarded
def plan(specs: tuple[str, ...], as_json: bool, fix: bool, variables: tuple[str, ...], select: tuple[str, ...],
         exclude: tuple[str, ...]) -> int:
    """Search the catalog (metadata only), resolve the grid and print the plan and memory budget.

    With --json stdout holds only JSON: the plan object (a list with several specs), or an error object
    {"spec", "error": {"type", "message", "exit_code"}}; with --fix the fixes are a "fixes" list in it.
    """
    if not as_json:
        return _plan_text(specs, fix, _parse_vars(variables), select, exclude)
    payloads: list[dict[str, Any]] = []
    worst = 0
    try:
        loaded_specs, broken = _load_selected(specs, _parse_vars(variables), select, exclude)
    except RasterflowError as err:
        click.echo(json.dumps(_error_object(err, None), indent=2))
        return int(err.exit_code)
    for path, problem in broken:
        payloads.append(_error_object(problem, str(path)))
        worst = max(worst, int(problem.exit_code))
    for loaded in loaded_specs:
        try:
            from rasterflow.commands import plan_command

            result = plan_command(loaded)
            payload = dict(result.payload)
            if fix:
                from rasterflow.budget import complete_patch

                payload["fixes"] = [{"description": c.description, "patch": c.patch,
                                     "sections": complete_patch(loaded.spec, c.patch)}
                                    for c in result.plan.report.fixes]
            payloads.append(payload)
            worst = max(worst, result.exit_code)
        except BrokenPipeError:
            raise
        except Exception as err:  # JSON on stdout whatever happens
            if _State.debug:
                raise
            payloads.append(_error_object(err, str(loaded.path)))
            worst = max(worst, int(err.exit_code) if isinstance(err, RasterflowError) else 1)
    click.echo(json.dumps(payloads[0] if len(payloads) == 1 else payloads, indent=2, default=str))
    return worst


def _plan_text(specs: tuple[str, ...], fix: bool, variables: dict[str, str], select: tuple[str, ...],
               exclude: tuple[str, ...]) -> int:
    from rasterflow.commands import plan_command

    loaded_specs, broken = _load_selected(specs, variables, select, exclude)
    worst = 0
    for _path, err in broken:
        _fail(str(err), error=err)
        worst = max(worst, int(err.exit_code))
    for index, loaded in enumerate(loaded_specs):
        if index:
            click.echo()
        try:
            result = plan_command(loaded)
        except RasterflowError as err:
            if _State.debug:
                raise
            _fail(str(err), error=err)
            worst = max(worst, int(err.exit_code))
            continue
        _print_plan(loaded, result.plan)
        report = result.plan.report
        if fix and report.fixes:
            from rasterflow.budget import fix_text

            click.echo("\n# paste one of these into the spec (complete sections: each replaces the spec's own):")
            for candidate in report.fixes:
                click.echo(f"# {candidate.description}")
                click.echo(fix_text(loaded.spec, candidate))
        worst = max(worst, result.exit_code)
    return worst



def _layout_words(plan: JobPlan) -> str:
    """Why ``cluster.processes: auto`` chose the layout it did (empty for a layout the spec asked for)."""
    if plan.cluster.processes != "auto" or plan.cluster.address or plan.layout.source != "local":
        return ""
    from rasterflow.cluster import ONE_PROCESS_MAX_SECONDS

    if not plan.layout.processes:
        return f": one process (processes: auto; under {ONE_PROCESS_MAX_SECONDS:g} s of compute)"
    if plan.cluster.n_workers != "auto":
        return ": worker processes (n_workers is set)"
    from rasterflow.commands import long_for_one_process

    if long_for_one_process(plan):
        return f": worker processes (processes: auto; {ONE_PROCESS_MAX_SECONDS:g} s of compute or more)"
    return ": worker processes (processes: auto; one process would be over budget)"

def _print_plan(loaded: LoadedSpec, plan: JobPlan) -> None:
    from rasterflow.budget import ALIGNED_GDAL_CACHEMAX, strip_target
    from rasterflow.commands import assets_applied
    from rasterflow.units import format_bytes

    echo = click.secho
    report, inputs = plan.report, plan.report.inputs
    cy, cx = inputs.chunk_yx
    echo(f"plan for {loaded.path} ({plan.name})", bold=True)
    echo(f"  items found      {len(plan.items)}")
    echo(f"  grid             {plan.grid.shape[0]} x {plan.grid.shape[1]} px, {plan.grid.crs}, "
         f"{plan.grid.resolution:g} m, bounds {tuple(round(b, 3) for b in plan.grid.bounds)}")
    depth = inputs.items_per_task
    # a task holds only the items whose files meet its chunk (the plan's chunk index): say so when that is fewer
    held = f" (at most {depth} of {inputs.time_per_chunk} meet one chunk)" if depth < inputs.time_per_chunk else ""
    echo(f"  chunk            time {depth} x y {cy} x x {cx}, {inputs.dtype}: "
         f"{format_bytes(inputs.plane_bytes)} per asset plane{held}")
    if report.sub_block != (0, 0):
        rows, cols = report.sub_block
        echo(f"  sub-blocks       {rows} x {cols} px: each task reduces its chunk one sub-block at a time (a whole "
             f"chunk's series would be over the {format_bytes(strip_target(inputs))} per-task target)")
    for index, (name, asset) in enumerate(assets_applied(plan).items()):
        label = "assets" if index == 0 else ""
        key = f" ({asset['key']})" if asset["key"] != name else ""
        echo(f"  {label:<16} {name}{key}: loaded as {asset['load_dtype']}")
        for line in asset["applied"]:
            echo(f"  {'':<18} {line}")
    echo(f"  tasks            about {report.task_count:,}")
    if plan.cost is not None:  # from the items' declared grids: no file is opened
        cost = plan.cost
        unknown = f"; {cost.undeclared_files:,} without proj: metadata counted as the whole grid" \
            if cost.undeclared_files else ""
        echo(f"  bytes read       about {format_bytes(cost.bytes_read)} decoded from {cost.files:,} files{unknown}")
        echo(f"  wall time        {cost.summary()}")
        if cost.remote is not None:
            echo(f"  remote reads     {cost.remote.summary()}")
    echo(f"  workers          {plan.layout.n_workers} x {plan.layout.threads_per_worker} thread(s), "
         f"limit {format_bytes(plan.layout.memory_limit)} each ({plan.layout.source}){_layout_words(plan)}")
    if plan.cluster.gdal_cachemax == "auto":
        why = ("every file on the grid, its tiles on the chunks' edges: each block is decoded once"
               if plan.gdal_cachemax == ALIGNED_GDAL_CACHEMAX else
               "reads that may decode a block twice (warped, tiles cut by chunk edges, or not known yet)")
        echo(f"  GDAL cache       {format_bytes(plan.gdal_cachemax)} per worker (auto: {why})")
    echo("  stage                 live planes   per task")
    for stage in report.stages:
        marker = "  <- worst" if stage is report.worst_stage else ""
        echo(f"    {stage.stage:<20} {stage.planes:>8g}   {format_bytes(stage.bytes_per_task):>9}{marker}")
    costs = plan.statistics_cost  # what each statistic adds to the reduce stage
    for line in costs.lines() if costs is not None else ():
        echo(line)
    echo(f"  per worker       {report.formula}")
    echo(f"                   = {report.fraction_of_limit:.0%} of the limit (allowed {inputs.max_fraction:.0%})")
    echo(f"  peak per worker  {format_bytes(report.peak_per_worker)}")
    if plan.output.format == "cog":  # the client assembles the COGs (budget.client_peak_bytes)
        echo(f"  client (COG)     {format_bytes(report.client_peak)}: baseline, blocks in flight and its GDAL cache")
    for warning in report.warnings:
        echo(f"  warning: {warning}", fg="yellow")
    if report.ok:
        echo("  verdict          fits", fg="green")
    else:
        for refusal in report.refusals:
            echo(f"  refused: {refusal}", fg="red")
        for candidate in report.fixes:
            echo(f"  fix: {candidate.description} -> {format_bytes(candidate.peak_per_worker)} per worker "
                 f"({candidate.fraction:.0%})")


# --------------------------------------------------------------------------------------------------------------------
# run and retry


class _RunView:
    """Renders a run's events: human lines, or JSON events (``--log-format json``)."""

    def __init__(self, name: str, *, dry_run: bool = False):
        self.name = name
        self.dry_run = dry_run  # the verdict is one line per spec (_dry_run_line)

    def emit(self, kind: str, fields: dict[str, Any]) -> None:
        if _json_logs():
            self._json(kind, fields)
            return
        if kind == "warning":
            _warn(fields["message"])
        elif kind == "start":
            _say(f"run {fields['spec']} -> {fields['output']} (if_exists: {fields['policy']})", min_verbosity=1)
        elif kind == "plan":
            _say(f"plan: {fields['items']} items, about {fields['tasks']:,} tasks", min_verbosity=1)
        elif kind == "dashboard":
            _say(f"dashboard: {fields['link']}", err=True)
        elif kind == "took_over":
            holder = fields["holder"]
            _say(f"note: took over the lock {fields['lock']} left by pid {holder.get('pid')} on {holder.get('host')} "
                 f"(started {holder.get('started_at')}), which is gone", err=True)
        elif kind == "resumed":
            _say(f"resumed: {fields['skipped']} blocks were already written and skipped, {fields['written']} "
                 f"written now")
        elif kind == "up_to_date":
            from rasterflow.report import shortened

            outputs = shortened(list(fields["outputs"]), "outputs")
            _say(f"up to date: {', '.join(outputs)} (same fingerprint: spec, items, rasterflow version; "
                 f"nothing was rewritten)")
        elif kind == "update":
            _say(f"update: recomputing {len(fields['recomputed'])} file(s) whose period changed, keeping "
                 f"{len(fields['kept'])} up to date")
        elif kind == "memory_plot":
            _say(f"memory plot: {fields['path']}")
        elif kind == "sample":
            _say(f"sample scenes: {fields['directory']} ({fields['dates']} dates, {fields['seconds']:.1f} s)")
        elif kind == "demo_result":
            output = fields["output"]
            if fields.get("folder"):
                _say(f"\ndemo folder: {fields['folder']} (spec, sample scenes and results)", bold=True)
            _say(f"\nresult: {output}", bold=True)
            if fields["format"] == "zarr":
                _say(f'open it: python -c "import xarray as xr; print(xr.open_zarr(\'{output}\'))"')
                _say(f"     or: gdalinfo 'ZARR:\"{output}\":/{fields.get('band', 'ndvi')}'  (or QGIS)")
            else:
                _say(f"open it: rio info {output}  (or QGIS)")
            if fields.get("stac_items"):
                _say(f"STAC items: {fields['stac_items']}")
        elif kind == "done":
            self._done(fields["result"], fields.get("summary") or [])

    def _done(self, result: RunResult, summary: list[str]) -> None:
        if result.status == "up_to_date" or self.dry_run:
            return
        if result.exit_code == 0:
            if _State.verbosity < 0:
                click.echo(f"ok {result.name}")
                return
            for line in summary:
                click.echo(line)
            if result.report and result.report.get("note"):
                click.echo(f"note: {result.report['note']}")
            click.echo(f"report: {result.report_path}")
            return
        if result.status == "interrupted":
            click.secho(f"{result.name}: {result.error}", fg="red", err=True)
        else:
            if _State.debug and result.exception is not None and result.exception.__cause__ is not None:
                raise result.exception
            click.secho(result.error or f"{result.name}: {result.status}", fg="red", err=True)
        if result.report_path:
            click.echo(f"report: {result.report_path}", err=True)

    def _json(self, kind: str, fields: dict[str, Any]) -> None:
        from rasterflow.logs import json_event

        if kind == "done":
            result = fields["result"]
            entry = result.to_dict()
            entry.pop("name", None)
            entry["spec_path"] = entry.pop("spec")
            if result.exit_code != 0:  # where to look: the spec's file and line, the error's type
                from rasterflow.logs import error_fields

                entry = {**error_fields(result.exception, result.exit_code), **entry}
            json_event("done" if result.exit_code == 0 else "error", self.name, **entry)
            return
        if kind in ("dashboard", "sample", "demo_result", "memory_plot") and _State.verbosity < 1:
            return
        json_event(kind, self.name, **{("spec_path" if k == "spec" else k): v for k, v in fields.items()})


def _progress_stream(name: str) -> TextSink | None:
    if _State.verbosity < 0:
        return None
    if _json_logs():
        from rasterflow.logs import ProgressEvents

        return ProgressEvents(name)
    return sys.stdout


_run_options = [
    click.option("--report", "report_path", type=click.Path(path_type=Path),
                 help="Where to write the run report JSON (one spec only)."),
    click.option("--plot", is_flag=True, help="Save a PNG of worker memory over time next to the report."),
    click.option("--overwrite", is_flag=True, help="Recompute and replace the outputs (if_exists: overwrite)."),
    click.option("--results", "results_path", type=click.Path(path_type=Path), default=None,
                 help="The results file of this invocation (default: its own file in .rasterflow/results/, "
                      "copied to .rasterflow/run_results.json; or $RASTERFLOW_RESULTS)."),
]


def _with_run_options(func: _F) -> _F:
    for option in reversed(_run_options):
        func = option(func)
    return func


@cli.command()
@_specs_argument
@_with_run_options
@click.option("--dry-run", is_flag=True, help="Only say, per spec, whether it would run, be skipped (up to date) "
                                              "or be refused (and why); nothing is written.")
@_var_option
@_select_option
@_exclude_option
@_global_options
@_guarded
def run(specs: tuple[str, ...], report_path: Path | None, plot: bool, overwrite: bool, results_path: Path | None,
        dry_run: bool, variables: tuple[str, ...], select: tuple[str, ...], exclude: tuple[str, ...]) -> int:
    """Plan, check, compute and write each SPEC (files, folders, globs); write a run report for each and one
    results file for the invocation."""
    loaded_specs, broken = _load_selected(specs, _parse_vars(variables), select, exclude)
    if report_path and len(loaded_specs) + len(broken) > 1:
        raise UsageError("--report names one file; with several specs each report goes beside its output "
                         "(and every spec is listed in the results file)")
    jobs: list[tuple[LoadedSpec, dt.datetime | None]] = [(loaded, None) for loaded in loaded_specs]
    return _run_jobs(jobs, broken, report_path=report_path, plot=plot, overwrite=overwrite,
                     results_path=results_path, dry_run=dry_run, command="run")


@cli.command()
@click.option("--results", "results_path", type=click.Path(path_type=Path), default=None,
              help="The results file to retry (it is replaced by this invocation's results); default: every spec "
                   "whose latest result in .rasterflow/results/ failed, was interrupted or locked "
                   "(or $RASTERFLOW_RESULTS).")
@click.option("--overwrite", is_flag=True, help="Recompute and replace the outputs (if_exists: overwrite).")
@click.option("--plot", is_flag=True, help="Save a PNG of worker memory over time next to each report.")
@_var_option
@_global_options
@_guarded
def retry(results_path: Path | None, overwrite: bool, plot: bool, variables: tuple[str, ...]) -> int:
    """Rerun the failed, interrupted and locked specs of the last results file, with the variables and the window
    end ("now") they had; an interrupted Zarr run resumes."""
    from rasterflow.batch import RESULTS_ENV, ResultsFile, default_results_path, latest_retry_entries, retry_entries
    from rasterflow.spec import load_spec

    if results_path is not None or os.environ.get(RESULTS_ENV):
        path = results_path or default_results_path()
        data = ResultsFile.read(path)
        entries = [dict(e, cwd=data.get("cwd")) for e in retry_entries(data)]
        where = str(path)
    else:  # every invocation's own results: the specs whose latest result is failed, interrupted or locked
        entries, where = latest_retry_entries()
    if not entries:
        _say(f"nothing to retry: no failed, interrupted or locked spec in {where}")
        return 0
    overrides = _parse_vars(variables)
    jobs, broken = [], []
    for entry in entries:
        spec_path = Path(entry["spec"])
        if not spec_path.is_absolute() and not spec_path.exists():
            spec_path = Path(entry.get("cwd") or ".") / spec_path
        try:
            loaded = load_spec(spec_path, variables={**(entry.get("variables") or {}), **overrides})
        except SpecError as err:
            broken.append((spec_path, err))
            continue
        now = dt.datetime.fromisoformat(entry["now"]) if entry.get("now") else None
        jobs.append((loaded, now))
    _say(f"retrying {len(jobs) + len(broken)} spec(s) from {where}", min_verbosity=0)
    return _run_jobs(jobs, broken, report_path=None, plot=plot, overwrite=overwrite, results_path=results_path,
                     dry_run=False, command="retry")


def _run_jobs(jobs: list[tuple[LoadedSpec, dt.datetime | None]], broken: list[tuple[Path, SpecError]], *,
              report_path: Path | None, plot: bool, overwrite: bool, results_path: Path | None, dry_run: bool,
              command: str) -> int:
    from rasterflow.batch import argv, default_results_path, invocation_results, prune_state
    from rasterflow.commands import run_command
    from rasterflow.signals import Interrupts

    # a dry run does not replace the last real results (retry reads them) unless a file is named
    results = invocation_results(results_path, command, argv()) if (not dry_run or results_path) else None
    state_dir = (results_path or default_results_path()).parent
    worst = 0
    for spec_path, err in broken:
        _fail(str(err), spec_path.stem, error=err)
        worst = max(worst, int(err.exit_code))
        if results is not None:
            results.add({"spec": str(spec_path), "name": None, "status": "invalid", "exit_code": int(err.exit_code),
                         "outputs": [], "report": None, "error": str(err), "seconds": 0.0})
    interrupts = Interrupts().install()
    try:
        for index, (loaded, now) in enumerate(jobs):
            if interrupts.received is not None:
                break
            interrupts.deferring = False
            now = now or dt.datetime.now(dt.timezone.utc)
            view = _RunView(loaded.spec.name, dry_run=dry_run)
            result = run_command(loaded, report_path=report_path, plot=plot, overwrite=overwrite, emit=view.emit,
                                 progress_stream=None if dry_run else _progress_stream(loaded.spec.name),
                                 interrupts=interrupts, state_dir=state_dir, now=now, dry_run=dry_run)
            if dry_run:
                _dry_run_line(loaded, result)
            if results is not None:
                report = result.report or {}
                results.add({**result.to_dict(), "variables": dict(loaded.variables), "now": now.isoformat(),
                             "started_at": report.get("started_at"), "finished_at": report.get("finished_at")})
            worst = max(worst, result.exit_code)
            if result.status == "interrupted":
                rest = [j[0].spec.name for j in jobs[index + 1:]]
                if rest:
                    _fail(f"not started: {', '.join(rest)} (rasterflow retry runs them)")
                    if results is not None:
                        for loaded_rest, _ in jobs[index + 1:]:
                            results.add({"spec": str(loaded_rest.path), "name": loaded_rest.spec.name,
                                         "status": "interrupted", "exit_code": result.exit_code, "outputs": [],
                                         "report": None, "error": "not started: the batch was interrupted",
                                         "seconds": 0.0, "variables": dict(loaded_rest.variables)})
                break
    finally:
        interrupts.restore()
        if results is not None:
            results.write(finished=True)
            _say(f"results: {results.path}", min_verbosity=1)
        if not dry_run:
            prune_state(Path(state_dir) / "run_results.json")
    return worst


def _dry_run_line(loaded: LoadedSpec, result: RunResult) -> None:
    if _json_logs():
        return
    if result.status == "would_run":
        verdict = f"run     {loaded.spec.name}  -> {', '.join(result.outputs[:3])}"
    elif result.status == "up_to_date":
        verdict = f"skip    {loaded.spec.name}  (up to date)"
    else:
        verdict = f"refuse  {loaded.spec.name}  ({result.status}: {(result.error or '').splitlines()[0]})"
    click.echo(verdict)


# --------------------------------------------------------------------------------------------------------------------
# profile, schema, demo


@cli.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--flamegraph", type=click.Path(path_type=Path), default=None,
              help="Write memray's HTML flame graph of the task to this path.")
@click.option("--no-memray", is_flag=True, help="Measure with tracemalloc only.")
@_var_option
@_global_options
@_guarded
def profile(spec: Path, flamegraph: Path | None, no_memray: bool, variables: tuple[str, ...]) -> int:
    """Run one representative task in-process and print measured vs predicted memory."""
    from rasterflow.commands import profile_command
    from rasterflow.spec import load_spec

    loaded = load_spec(spec, variables=_parse_vars(variables))
    lines = profile_command(loaded, flamegraph=str(flamegraph) if flamegraph else None, use_memray=not no_memray,
                            emit=_RunView(loaded.spec.name).emit)
    for line in lines:
        click.echo(line)
    return ExitCode.OK


@cli.command()
@click.option("--write", "write_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Write the schema to PATH (default schemas/rasterflow.schema.json) instead of printing it.")
@click.option("--check", "check_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Exit 1 when the schema file at PATH is stale.")
@_global_options
@_guarded
def schema(write_path: str | None, check_path: str | None) -> int:
    """Print or write the JSON Schema of the spec."""
    from rasterflow.spec.schema import schema_text

    text = schema_text()
    if check_path:
        current = Path(check_path).read_text() if Path(check_path).exists() else ""
        if current != text:
            _fail(f"{check_path} is stale; regenerate it with: rasterflow schema --write")
            return ExitCode.RUN_FAILED
        click.echo(f"{check_path} is up to date")
        return ExitCode.OK
    if write_path:
        Path(write_path).parent.mkdir(parents=True, exist_ok=True)
        Path(write_path).write_text(text)
        click.echo(f"wrote {write_path}")
        return ExitCode.OK
    click.echo(text, nl=False)
    return ExitCode.OK


@cli.command()
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="The demo folder: the spec, the sample scenes and the results go there "
              "(default: ./rasterflow-demo).")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=None,
              help="Run this spec instead of the one bundled with rasterflow (its paths are relative to it).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Where the sample scenes are generated (default: what the demo spec's catalog points at).")
@_global_options
@_guarded
def demo(out_dir: Path | None, spec_path: Path | None, data_dir: Path | None) -> int:
    """Copy the bundled demo spec into a folder of the current directory (or --out), generate the synthetic sample
    scenes there if missing and run the demo pipeline end to end."""
    from rasterflow.commands import demo_command
    from rasterflow.signals import Interrupts

    view = _RunView("demo")
    with Interrupts() as interrupts:
        result = demo_command(spec_path=spec_path, data_dir=data_dir, out_dir=out_dir, emit=view.emit,
                              progress_stream=_progress_stream("demo"), interrupts=interrupts)
    return result.exit_code


def _register_stack_dump() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr: how to see where a cron run hangs
    without stopping it (the run goes on). Registered only by the console entry points, never for an API caller.

    A Python-level handler, not ``faulthandler.register``: that one walks the other threads' frames from the C
    signal handler while they run, and a run of the tests died of it (SIGSEGV while the event loop thread was
    creating a task). Here the dump runs in the main thread holding the GIL, so no thread changes its frames
    meanwhile; the main thread waits on the workers in interruptible waits, so the dump comes at once."""
    import signal

    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None:
        signal.signal(usr1, _dump_stacks)


def _dump_stacks(signum: int, frame: object) -> None:
    import faulthandler

    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def main() -> None:
    """Console-script entry point."""
    _register_stack_dump()
    cli(prog_name="rasterflow")
