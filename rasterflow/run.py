"""The thin orchestrator: spec -> search -> plan -> budget -> cluster -> graph -> writer -> report.

Every step is a function of its own module; this one wires them, times them and keeps the run report honest: a
report is written after every run that got as far as knowing its output, successful or not.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from rasterflow import budget
from rasterflow.errors import ExitCode, RasterflowError, RunFailedError
from rasterflow.plan import JobPlan, check_items, local_layout, make_plan
from rasterflow.units import format_bytes, parse_bytes

__all__ = [
    "search", "resolve_layout", "plan_with_items", "plan_command", "run_command", "profile_command", "demo_command",
    "fingerprint",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _echo(message: str = "", **style: Any) -> None:
    click.secho(message, **style)


def plan_with_items(loaded: Any, items: list[dict], layout: Any) -> JobPlan:
    """The plan for searched items, checked against the spec (asset keys, mask types: exit 2 before any pixel is
    read); also reads the first loaded asset's header for its tile shape (no pixels)."""
    from rasterflow.catalog import source_tile_shape

    spec = loaded.spec
    plan = make_plan(spec, items=items, layout=layout)
    check_items(loaded, plan)
    assets = plan.shape.assets_loaded
    tile = source_tile_shape(items, spec.source.assets[assets[0]]) if assets and items else None
    if tile is None:
        return plan
    return make_plan(spec, items=items, layout=layout, source_tile=tile)


def search(loaded: Any) -> list[dict]:
    """Search the spec's catalog (metadata only)."""
    from rasterflow.catalog import StacQuery, search_items

    stac = loaded.spec.source.stac
    query = StacQuery(
        catalog=loaded.resolve(stac.catalog),
        collections=tuple(stac.collections),
        bbox=tuple(stac.bbox),
        datetime=stac.datetime,
        query=stac.query,
        filter=stac.filter,
        max_items=stac.max_items,
    )
    return search_items(query)


def resolve_layout(spec: Any):
    """The workers the job will run on: the real ones of a scheduler address, or the LocalCluster sizing."""
    from rasterflow.cluster import ClusterSettings, remote_layout, resolve_address

    address = resolve_address(ClusterSettings.from_spec(spec.cluster))
    if address:
        return remote_layout(address)
    return local_layout(spec)


def fingerprint(loaded: Any, plan: JobPlan) -> str:
    """Identity of a job's output: same spec bytes, items, grid and chunks -> same output (resume allowed)."""
    digest = hashlib.sha256()
    digest.update(loaded.sha256.encode())
    digest.update(json.dumps([item["id"] for item in plan.items]).encode())
    digest.update(json.dumps([plan.grid.bounds, plan.grid.shape, plan.chunks]).encode())
    return digest.hexdigest()[:32]


def plan_command(loaded: Any, *, as_json: bool = False, fix: bool = False) -> int:
    """``rasterflow plan``: search, resolve, estimate; print a table (or JSON); exit 3 when refused."""
    items = search(loaded)
    layout = resolve_layout(loaded.spec)
    plan = plan_with_items(loaded, items, layout)
    report = plan.report
    if as_json:
        payload = {
            "spec": str(loaded.path),
            "items": len(items),
            "item_ids": [item["id"] for item in items],
            "grid": {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                     "transform": list(plan.grid.transform)},
            "layout": {"n_workers": layout.n_workers, "threads_per_worker": layout.threads_per_worker,
                       "memory_limit": layout.memory_limit, "source": layout.source},
            "assets": _assets_applied(plan),
            "budget": report.to_dict(),
        }
        click.echo(json.dumps(payload, indent=2))
    else:
        _print_plan(loaded, plan)
    if fix and report.fixes:
        _echo("\n# paste one of these into the spec:")
        for candidate in report.fixes:
            _echo(f"# {candidate.description}")
            for section, values in candidate.patch.items():
                _echo(f"{section}: " + "{" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}")
    return ExitCode.OK if report.ok else ExitCode.OVER_BUDGET


def _assets_applied(plan: JobPlan) -> dict[str, dict]:
    """Per loaded asset: its key, the dtype it loads in and what metadata was applied (for how many items)."""
    if plan.sources is None:
        return {}
    return {a.name: {"key": a.key, "load_dtype": a.load_dtype, "applied": list(a.applied)} for a in plan.sources.assets}


def _print_plan(loaded: Any, plan: JobPlan) -> None:
    report, inputs = plan.report, plan.report.inputs
    cy, cx = inputs.chunk_yx
    _echo(f"plan for {loaded.path} ({loaded.spec.name})", bold=True)
    _echo(f"  items found      {len(plan.items)}")
    _echo(f"  grid             {plan.grid.shape[0]} x {plan.grid.shape[1]} px, {plan.grid.crs}, "
          f"{plan.grid.resolution:g} m, bounds {tuple(round(b, 3) for b in plan.grid.bounds)}")
    _echo(f"  chunk            time {inputs.time_per_chunk} x y {cy} x x {cx}, {inputs.dtype}: "
          f"{format_bytes(inputs.plane_bytes)} per asset plane")
    for index, (name, asset) in enumerate(_assets_applied(plan).items()):
        label = "assets" if index == 0 else ""
        key = f" ({asset['key']})" if asset["key"] != name else ""
        _echo(f"  {label:<16} {name}{key}: loaded as {asset['load_dtype']}")
        for line in asset["applied"]:
            _echo(f"  {'':<18} {line}")
    _echo(f"  tasks            about {report.task_count:,}")
    _echo(f"  workers          {plan.layout.n_workers} x {plan.layout.threads_per_worker} thread(s), "
          f"limit {format_bytes(plan.layout.memory_limit)} each ({plan.layout.source})")
    _echo("  stage                 live planes   per task")
    for stage in report.stages:
        marker = "  <- worst" if stage is report.worst_stage else ""
        _echo(f"    {stage.stage:<20} {stage.planes:>8g}   {format_bytes(stage.bytes_per_task):>9}{marker}")
    _echo(f"  per worker       {report.formula}")
    _echo(f"                   = {report.fraction_of_limit:.0%} of the limit (allowed {inputs.max_fraction:.0%})")
    for warning in report.warnings:
        _echo(f"  warning: {warning}", fg="yellow")
    if report.ok:
        _echo("  verdict          fits", fg="green")
    else:
        for refusal in report.refusals:
            _echo(f"  refused: {refusal}", fg="red")
        for candidate in report.fixes:
            _echo(f"  fix: {candidate.description} -> {format_bytes(candidate.peak_per_worker)} per worker "
                  f"({candidate.fraction:.0%})")


def run_command(loaded: Any, *, report_path: Path | None = None, plot: bool = False) -> int:
    """``rasterflow run`` for one spec: returns the exit code; the report is written whatever happens."""
    from rasterflow import write
    from rasterflow.report import RunReport, StageTimer, default_report_path

    spec = loaded.spec
    output_path = loaded.resolve(spec.output.path)
    fmt = spec.output.resolved_format
    report = RunReport.start(spec_path=str(loaded.path), spec_sha256=loaded.sha256, catalog=spec.source.stac.catalog,
                             name=spec.name, memory_thresholds=spec.cluster.memory.model_dump())
    report_file = Path(report_path) if report_path else Path(default_report_path(output_path))
    timer = StageTimer(report.stage_seconds)
    code = ExitCode.RUN_FAILED
    try:
        # Refuse before any work: never replace an existing result unless asked.
        write.check_output_target(output_path, fmt, overwrite=spec.output.overwrite, fingerprint=None)
        with timer("search"):
            items = search(loaded)
            layout = resolve_layout(spec)
        report.item_ids = [item["id"] for item in items]
        with timer("plan"):
            plan = plan_with_items(loaded, items, layout)
        _record_plan(report, plan)
        for warning in plan.report.warnings:
            _echo(f"warning: {warning}", fg="yellow", err=True)
        budget.enforce(plan.report, where=loaded.where("chunks"))
        job_id = fingerprint(loaded, plan)
        # Now that the items are known, so are all the files a COG run writes (one per period / quantile).
        expected = write.cog_output_paths(output_path, _leading_coords(plan)) if fmt == "cog" else None
        write.check_output_target(output_path, fmt, overwrite=spec.output.overwrite, fingerprint=job_id,
                                  paths=expected)
        result = _execute(loaded, plan, output_path, fmt, job_id, report, timer)
        report.outputs = [{"path": p, "bytes": write.path_size(p)} for p in result.paths]
        code = ExitCode.OK
    except RasterflowError as err:
        code = err.exit_code
        report.error = str(err)
        raise
    except KeyboardInterrupt:
        report.error = "interrupted"
        raise
    except Exception as err:
        report.error = f"{type(err).__name__}: {err}"
        raise RunFailedError(f"run failed: {type(err).__name__}: {err}") from err
    finally:
        report.finish(int(code))
        try:
            report.write(report_file)
        except OSError as err:
            _echo(f"could not write the run report {report_file}: {err}", fg="yellow", err=True)
        if plot and report.memory_samples:  # drawn last, so a failed run's plot says so too
            from rasterflow.report import plot_memory

            png = plot_memory(report, Path(str(output_path).rstrip("/") + ".memory.png"))
            _echo(f"memory plot: {png}")
        if code == ExitCode.OK:
            for line in report.summary_lines():
                _echo(line)
            _echo(f"report: {report_file}")
    return code


def _leading_coords(plan: JobPlan) -> dict[str, list]:
    """The output's leading dimensions (period, quantile) as the writers will name them."""
    coords: dict[str, list] = {}
    if plan.period_labels:
        coords["period"] = list(plan.period_labels)
    if plan.quantile_dim and plan.program is not None:
        coords["quantile"] = list(plan.program.quantiles)
    return coords


def _record_plan(report: Any, plan: JobPlan) -> None:
    report.grid = {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                   "transform": list(plan.grid.transform)}
    report.chunks = dict(plan.chunks)
    report.task_count = plan.report.task_count
    report.predicted_peak_per_worker = plan.report.peak_per_worker
    report.memory_limit = plan.layout.memory_limit


def _execute(loaded: Any, plan: JobPlan, output_path: str, fmt: str, job_id: str, report: Any, timer: Any):
    from rasterflow import graph, write
    from rasterflow.cluster import ClusterSettings, CountingProgress, MemorySampler, open_cluster

    spec = loaded.spec
    with ExitStack() as stack:
        with timer("cluster start"):
            handle = stack.enter_context(open_cluster(ClusterSettings.from_spec(spec.cluster), plan.layout))
        report.cluster = handle.as_dict()
        if handle.dashboard_link:
            _echo(f"dashboard: {handle.dashboard_link}", err=True)
        with MemorySampler(handle.client) as sampler:
            timer.on_start = sampler.mark
            with timer("graph"):
                dataset = graph.build_dataset(plan)
            with timer("compute+write"), CountingProgress(label="blocks written") as progress:
                if fmt == "zarr":
                    result = write.write_zarr(dataset, output_path, overwrite=spec.output.overwrite,
                                              compression=spec.output.compression, fingerprint=job_id,
                                              client=handle.client, progress=progress.update)
                else:
                    result = write.write_cog(dataset, output_path, overwrite=spec.output.overwrite,
                                             compression=spec.output.compression,
                                             gdal_cachemax=parse_bytes(spec.cluster.gdal_cachemax),
                                             client=handle.client, progress=progress.update)
            timer.on_start = None
        report.record_memory(sampler)
    if result.blocks_skipped:
        _echo(f"resumed: {result.blocks_skipped} blocks were already written and skipped, "
              f"{result.blocks_written} written now")
    return result


def profile_command(loaded: Any, *, flamegraph: str | None = None, use_memray: bool = True) -> int:
    """``rasterflow profile``: one representative task in this process, measured vs the model's prediction."""
    from rasterflow.profile import profile_one_task

    spec = loaded.spec
    plan = plan_with_items(loaded, search(loaded), local_layout(spec))
    if not plan.report.ok:
        _echo("warning: the budget check refuses this spec; profiling one task anyway", fg="yellow", err=True)
    result = profile_one_task(plan, spec, use_memray=use_memray, flamegraph=flamegraph)
    for line in result.lines():
        _echo(line)
    return ExitCode.OK


def demo_command(*, spec_path: Path | None = None, data_dir: Path | None = None) -> int:
    """Generate the sample scenes where the demo spec expects them (if missing), then run it."""
    from rasterflow.sample import generate_sample
    from rasterflow.spec import load_spec

    spec_path = Path(spec_path) if spec_path else REPO_ROOT / "pipelines" / "demo.yaml"
    if not spec_path.exists():
        raise RunFailedError(f"the demo spec {spec_path} is missing; run from a checkout of rasterflow or pass --spec")
    loaded = load_spec(spec_path)
    catalog = Path(loaded.resolve(loaded.spec.source.stac.catalog))
    target = Path(data_dir) if data_dir else catalog.parent
    started = time.perf_counter()
    sample = generate_sample(target)
    _echo(f"sample scenes: {sample.directory} ({len(sample.item_ids)} dates, {time.perf_counter() - started:.1f} s)")
    code = run_command(loaded)
    if code == ExitCode.OK:
        output = loaded.resolve(loaded.spec.output.path)
        _echo(f"\nresult: {output}", bold=True)
        if loaded.spec.output.resolved_format == "zarr":
            _echo(f'open it: python -c "import xarray as xr; print(xr.open_zarr(\'{output}\'))"')
        else:
            _echo(f"open it: rio info {output}  (or QGIS)")
    return code

