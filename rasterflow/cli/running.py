"""The verbs that compute: ``run`` and ``retry``, and how a run's events are shown."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rasterflow.cli.console import CommandFunction, fail, guarded, json_logs, say, ConsoleState, warn
from rasterflow.cli.group import (
    exclude_option,
    global_options,
    load_selected,
    parse_vars,
    select_option,
    specs_argument,
    var_option,
    cli,
)
from rasterflow.errors import SpecError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.commands import RunResult, TextSink
    from rasterflow.spec import LoadedSpec


# --------------------------------------------------------------------------------------------------------------------
# run and retry


class RunView:
    """Renders a run's events: human lines, or JSON events (``--log-format json``)."""

    def __init__(self, name: str, *, dry_run: bool = False):
        self.name = name
        self.dry_run = dry_run  # the verdict is one line per spec (_dry_run_line)

    def emit(self, kind: str, fields: dict[str, Any]) -> None:
        if json_logs():
            self._json(kind, fields)
            return
        if kind == "warning":
            warn(fields["message"])
        elif kind == "start":
            say(f"run {fields['spec']} -> {fields['output']} (if_exists: {fields['policy']})", min_verbosity=1)
        elif kind == "plan":
            say(f"plan: {fields['items']} items, about {fields['tasks']:,} tasks", min_verbosity=1)
        elif kind == "dashboard":
            say(f"dashboard: {fields['link']}", err=True)
        elif kind == "took_over":
            holder = fields["holder"]
            say(f"note: took over the lock {fields['lock']} left by pid {holder.get('pid')} on {holder.get('host')} "
                 f"(started {holder.get('started_at')}), which is gone", err=True)
        elif kind == "resumed":
            say(f"resumed: {fields['skipped']} blocks were already written and skipped, {fields['written']} "
                 f"written now")
        elif kind == "up_to_date":
            from rasterflow.report import shortened

            outputs = shortened(list(fields["outputs"]), "outputs")
            say(f"up to date: {', '.join(outputs)} (same fingerprint: spec, items, rasterflow version; "
                 f"nothing was rewritten)")
        elif kind == "update":
            say(f"update: recomputing {len(fields['recomputed'])} file(s) whose period changed, keeping "
                 f"{len(fields['kept'])} up to date")
        elif kind == "memory_plot":
            say(f"memory plot: {fields['path']}")
        elif kind == "sample":
            say(f"sample scenes: {fields['directory']} ({fields['dates']} dates, {fields['seconds']:.1f} s)")
        elif kind == "demo_result":
            output = fields["output"]
            if fields.get("folder"):
                say(f"\ndemo folder: {fields['folder']} (spec, sample scenes and results)", bold=True)
            say(f"\nresult: {output}", bold=True)
            if fields["format"] == "zarr":
                say(f'open it: python -c "import xarray as xr; print(xr.open_zarr(\'{output}\'))"')
                say(f"     or: gdalinfo 'ZARR:\"{output}\":/{fields.get('band', 'ndvi')}'  (or QGIS)")
            else:
                say(f"open it: rio info {output}  (or QGIS)")
            if fields.get("stac_items"):
                say(f"STAC items: {fields['stac_items']}")
        elif kind == "done":
            self._done(fields["result"], fields.get("summary") or [])

    def _done(self, result: RunResult, summary: list[str]) -> None:
        if result.status == "up_to_date" or self.dry_run:
            return
        if result.exit_code == 0:
            if ConsoleState.verbosity < 0:
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
            if ConsoleState.debug and result.exception is not None and result.exception.__cause__ is not None:
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
        if kind in ("dashboard", "sample", "demo_result", "memory_plot") and ConsoleState.verbosity < 1:
            return
        json_event(kind, self.name, **{("spec_path" if k == "spec" else k): v for k, v in fields.items()})


def progress_sink(name: str) -> TextSink | None:
    if ConsoleState.verbosity < 0:
        return None
    if json_logs():
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


def _with_run_options(func: CommandFunction) -> CommandFunction:
    for option in reversed(_run_options):
        func = option(func)
    return func


@cli.command()
@specs_argument
@_with_run_options
@click.option("--dry-run", is_flag=True, help="Only say, per spec, whether it would run, be skipped (up to date) "
                                              "or be refused (and why); nothing is written.")
@var_option
@select_option
@exclude_option
@global_options
@guarded
def run(specs: tuple[str, ...], report_path: Path | None, plot: bool, overwrite: bool, results_path: Path | None,
        dry_run: bool, variables: tuple[str, ...], select: tuple[str, ...], exclude: tuple[str, ...]) -> int:
    """Plan, check, compute and write each SPEC (files, folders, globs); write a run report for each and one
    results file for the invocation."""
    loaded_specs, broken = load_selected(specs, parse_vars(variables), select, exclude)
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
@var_option
@global_options
@guarded
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
        say(f"nothing to retry: no failed, interrupted or locked spec in {where}")
        return 0
    overrides = parse_vars(variables)
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
    say(f"retrying {len(jobs) + len(broken)} spec(s) from {where}", min_verbosity=0)
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
        fail(str(err), spec_path.stem, error=err)
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
            view = RunView(loaded.spec.name, dry_run=dry_run)
            result = run_command(loaded, report_path=report_path, plot=plot, overwrite=overwrite, emit=view.emit,
                                 progress_stream=None if dry_run else progress_sink(loaded.spec.name),
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
                    fail(f"not started: {', '.join(rest)} (rasterflow retry runs them)")
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
            say(f"results: {results.path}", min_verbosity=1)
        if not dry_run:
            prune_state(Path(state_dir) / "run_results.json")
    return worst


def _dry_run_line(loaded: LoadedSpec, result: RunResult) -> None:
    if json_logs():
        return
    if result.status == "would_run":
        verdict = f"run     {loaded.spec.name}  -> {', '.join(result.outputs[:3])}"
    elif result.status == "up_to_date":
        verdict = f"skip    {loaded.spec.name}  (up to date)"
    else:
        verdict = f"refuse  {loaded.spec.name}  ({result.status}: {(result.error or '').splitlines()[0]})"
    click.echo(verdict)
