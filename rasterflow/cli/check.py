"""The verbs that check without computing: ``validate`` (static) and ``plan`` (search and budget)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from rasterflow.cli.console import fail, guarded, ConsoleState
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
from rasterflow.errors import ExitCode, RasterflowError

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan
    from rasterflow.spec import LoadedSpec


# --------------------------------------------------------------------------------------------------------------------
# validate


@cli.command()
@specs_argument
@var_option
@select_option
@exclude_option
@global_options
@guarded
def validate(specs: tuple[str, ...], variables: tuple[str, ...], select: tuple[str, ...],
             exclude: tuple[str, ...]) -> int:
    """Parse and validate SPEC files (files, folders, globs) and run the static budget check (no network).

    Exit code: 0 all valid, 2 some invalid, 3 some over budget (the highest code of all files).
    """
    loaded_specs, broken = load_selected(specs, parse_vars(variables), select, exclude)
    worst = ExitCode.OK
    for _path, err in broken:
        fail(str(err), error=err)
        worst = max(worst, err.exit_code)
    for loaded in loaded_specs:
        try:
            verdict = _static_budget_line(loaded)
        except RasterflowError as err:
            fail(str(err), error=err)
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
@specs_argument
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON for scripts (only JSON on stdout).")
@click.option("--fix", is_flag=True, help="Print a corrected chunks/cluster block ready to paste.")
@var_option
@select_option
@exclude_option
@global_options
@guarded
def plan(specs: tuple[str, ...], as_json: bool, fix: bool, variables: tuple[str, ...], select: tuple[str, ...],
         exclude: tuple[str, ...]) -> int:
    """Search the catalog (metadata only), resolve the grid and print the plan and memory budget.

    With --json stdout holds only JSON: the plan object (a list with several specs), or an error object
    {"spec", "error": {"type", "message", "exit_code"}}; with --fix the fixes are a "fixes" list in it.
    """
    if not as_json:
        return _plan_text(specs, fix, parse_vars(variables), select, exclude)
    payloads: list[dict[str, Any]] = []
    worst = 0
    try:
        loaded_specs, broken = load_selected(specs, parse_vars(variables), select, exclude)
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
            if ConsoleState.debug:
                raise
            payloads.append(_error_object(err, str(loaded.path)))
            worst = max(worst, int(err.exit_code) if isinstance(err, RasterflowError) else 1)
    click.echo(json.dumps(payloads[0] if len(payloads) == 1 else payloads, indent=2, default=str))
    return worst


def _plan_text(specs: tuple[str, ...], fix: bool, variables: dict[str, str], select: tuple[str, ...],
               exclude: tuple[str, ...]) -> int:
    from rasterflow.commands import plan_command

    loaded_specs, broken = load_selected(specs, variables, select, exclude)
    worst = 0
    for _path, err in broken:
        fail(str(err), error=err)
        worst = max(worst, int(err.exit_code))
    for index, loaded in enumerate(loaded_specs):
        if index:
            click.echo()
        try:
            result = plan_command(loaded)
        except RasterflowError as err:
            if ConsoleState.debug:
                raise
            fail(str(err), error=err)
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
