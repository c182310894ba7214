"""Search and plan: the catalog search, the worker layout, the plan of the items, its fingerprint; plan, profile."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any, Sequence

from rasterflow.commands.results import Emit, PlanResult, no_emit
from rasterflow.errors import ExitCode
from rasterflow.planning import JobPlan, check_items, local_layout, make_plan

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import RemoteProbe
    from rasterflow.read.policy import ReadPolicy
    from rasterflow.sizing import WorkerLayout
    from rasterflow.sources import AssetRead, FileHeader
    from rasterflow.spec import LoadedSpec, Spec


ADVICE_TIMEOUT = 3.0
"""Seconds the tile-shape probe of ``plan`` waits for a file's header (advice: no answer means no advice)."""


def plan_with_items(loaded: LoadedSpec, items: list[dict[str, Any]], layout: WorkerLayout) -> JobPlan:
    """The plan for searched items, checked against the spec (asset keys, mask types: exit 2 before any pixel is
    read); also reads file headers (no pixels): the first loaded asset's tile shape, and data type and nodata of
    assets whose items declare none."""
    from rasterflow.budget import pipeline_shape
    from rasterflow.catalog import source_header, undeclared_headers
    from rasterflow.read import header_reader
    from rasterflow.read.policy import policy_from_spec

    spec = loaded.spec
    keys = [spec.source.assets[name] for name in pipeline_shape(spec).assets_loaded]
    # headers are opened as the workers will open the files: signed, the run's GDAL options and retries
    hrefs = [str(((item.get("assets") or {}).get(key) or {}).get("href") or "") for item in items for key in keys]
    policy = policy_from_spec(spec.source, [h for h in hrefs if h])
    read_header = header_reader(policy) if items else None
    headers = undeclared_headers(items, keys, read_header) if items else {}
    plan = make_plan(spec, items=items, layout=layout, headers=headers)
    check_items(loaded, plan)
    header = None
    probed = None
    if keys and items:
        # the tile shape is only advice: one try, a short timeout (a server that never answers held plan for
        # 488 s with the run's retries; tests/test_plan_scale.py)
        from dataclasses import replace

        quick = replace(policy, retry=replace(policy.retry, attempts=1, timeout=min(policy.retry.timeout,
                                                                                     ADVICE_TIMEOUT)))
        remote = remote_probe(items[0], keys[0], quick, spec.source.io.reader)
        if remote is not None:
            header, probed = remote
            if len(keys) > 1:  # the bytes per pixel of every asset's first file, not of the first asset's alone
                probed = replace(probed, bytes_per_pixel=assets_bytes_per_pixel(items[0], keys, quick)
                                 or probed.bytes_per_pixel)
        else:
            advice = header_reader(quick)
            header = headers[keys[0]] if keys[0] in headers else source_header(items[:1], keys[0], advice)
    if header is not None and (header.tile_shape is not None or header.compression is not None):
        plan = make_plan(spec, items=items, layout=layout, source_tile=header.tile_shape, headers=headers,
                         source_codec=header.compression, remote=probed)
    return _located(loaded, plan)


def _located(loaded: LoadedSpec, plan: JobPlan) -> JobPlan:
    """The plan with the paths the spec gives relative to its own folder made absolute (the catalog, for the
    output's STAC links) and the spec text's digest (the fingerprint's): after this, nothing needs the loaded
    spec."""
    from dataclasses import replace

    return replace(plan, output=replace(plan.output, catalog=loaded.resolve(plan.output.catalog)),
                   spec_sha256=loaded.sha256)


def _probe_read(item: dict[str, Any], key: str) -> AssetRead | None:
    """``item``'s file of asset ``key`` as a read of the concurrent reader, for a header probe; None when there is no
    such file or the concurrent reader does not read it (local, or left to GDAL)."""
    from rasterflow.read.fetch import supported
    from rasterflow.sources import AssetRead

    href = str(((item.get("assets") or {}).get(key) or {}).get("href") or "")
    if not href or not supported(href):
        return None
    return AssetRead(item_id=str(item.get("id")), name=key, key=key, href=href, data_type=None, nodata=None,
                     scale=1.0, offset=0.0, crs=None, transform=None, shape=None, band_count=None, footprint=None,
                     direct=False)


def remote_probe(item: dict[str, Any], key: str, policy: ReadPolicy,
                 reader: str) -> tuple[FileHeader, RemoteProbe] | None:
    """For a remote first file the concurrent reader reads (http(s), s3): its header through that reader, timed
    -> ``(FileHeader, RemoteProbe)``; None when the file is local, left to GDAL or did not answer (then GDAL's
    header read gives the advice, and nothing is said of the network)."""
    from rasterflow.planning import RemoteProbe
    from rasterflow.sources import FileHeader

    read = _probe_read(item, key)
    if reader == "gdal" or read is None:
        return None
    from rasterflow.read.prefetch import probe

    parsed, seconds = probe(read, policy)
    if parsed is None or parsed.facts is None:
        return None
    facts = parsed.facts
    header = FileHeader(href=read.href, data_type=facts.dtype, nodata=facts.nodata, band_count=facts.count,
                        tile_shape=facts.tile_shape, compression=facts.codec)
    return header, RemoteProbe(round_trip=seconds, bytes_per_pixel=facts.compressed_bytes_per_pixel,
                               decodable=parsed.index is not None)


def assets_bytes_per_pixel(item: dict[str, Any], keys: Sequence[str], policy: ReadPolicy) -> float | None:
    """The compressed bytes per pixel of ``item``'s files of ``keys`` together, their headers read at once through
    the concurrent reader (what the remote cost and the budget's held tiles multiply by); None when none answered."""
    from rasterflow.read.prefetch import compressed_bytes_per_pixel

    reads = [read for read in (_probe_read(item, key) for key in keys) if read is not None]
    return compressed_bytes_per_pixel(reads, policy) if reads else None


def search(loaded: LoadedSpec, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Search the spec's catalog (metadata only); a relative window ends at ``now`` (default: the current time)."""
    from rasterflow.catalog import StacQuery, resolve_datetime, search_items

    stac = loaded.spec.source.stac
    bbox = None
    if stac.bbox is not None:  # four numbers (the spec's validation)
        west, south, east, north = stac.bbox
        bbox = (west, south, east, north)
    query = StacQuery(
        catalog=loaded.resolve(stac.catalog),
        collections=tuple(stac.collections),
        bbox=bbox,
        intersects=stac.intersects if isinstance(stac.intersects, dict) else None,
        datetime=resolve_datetime(stac.datetime, now) if now is not None else stac.datetime,
        query=stac.query,
        filter=stac.filter,
        max_items=stac.max_items,
    )
    from rasterflow import retry  # source.retry covers the STAC API requests too
    from rasterflow.errors import CatalogError, NoItemsFoundError

    try:
        with retry.using(retry.RetryPolicy.from_spec(loaded.spec.source.retry)):
            return search_items(query)
    except CatalogError as err:  # the spec's file:line: which key to change
        if isinstance(err, NoItemsFoundError):
            field = getattr(err, "field", "")
            where, key = ((loaded.where("source", "stac", "bbox"), "source.stac.bbox") if field == "bbox"
                          else (loaded.where("source", "stac"), "source.stac"))
        else:
            where, key = loaded.where("source", "stac", "catalog"), "source.stac.catalog"
        hint = ("; a relative path is relative to the spec file's folder" if "not found" in str(err)
                and "://" not in str(loaded.spec.source.stac.catalog) else "")
        located = type(err)(f"{where}: {key}: {err}{hint}")
        located.__dict__.update(err.__dict__)
        raise located from err.__cause__


def resolve_layout(spec: Spec) -> WorkerLayout:
    """The workers the job will run on: the real ones of a scheduler address, or the local sizing (worker
    processes or one process: ``cluster.processes``)."""
    from rasterflow.cluster import ClusterSettings, local_run_layout, remote_layout, resolve_address

    settings = ClusterSettings.from_spec(spec.cluster)
    address = resolve_address(settings)
    if address:
        return remote_layout(address)
    return local_run_layout(settings)


def long_for_one_process(plan: JobPlan) -> bool:
    """Whether ``processes: auto`` runs the job in worker processes for its length: ``plan`` estimates at least
    :data:`~rasterflow.cluster.ONE_PROCESS_MAX_SECONDS` of compute (start-up not counted)."""
    from rasterflow.cluster import ONE_PROCESS_MAX_SECONDS
    from rasterflow.planning import STARTUP_SECONDS

    return plan.cost is not None and plan.cost.wall_seconds - STARTUP_SECONDS >= ONE_PROCESS_MAX_SECONDS


def processes_if_refused(loaded: LoadedSpec, items: list[dict[str, Any]], layout: WorkerLayout,
                          plan: JobPlan) -> tuple[WorkerLayout, JobPlan]:
    """``cluster.processes: auto`` planned one process: plan worker processes when the budget refused it, or when
    the job is long (:data:`~rasterflow.cluster.ONE_PROCESS_MAX_SECONDS` of estimated compute) and fits them."""
    from rasterflow.cluster import ClusterSettings, process_fallback

    fallback = process_fallback(ClusterSettings.from_spec(loaded.spec.cluster), layout)
    if fallback is None:
        return layout, plan
    if not plan.report.ok:
        return fallback, plan_with_items(loaded, items, fallback)
    if long_for_one_process(plan):
        processes = plan_with_items(loaded, items, fallback)
        if processes.report.ok:
            return fallback, processes
    return layout, plan


def fingerprint(plan: JobPlan, period_items: Sequence[dict[str, Any]] | None = None) -> str:
    """Identity of a job's output: same spec (after variables), same items with the same ``updated`` times, same
    grid and chunks, same rasterflow version -> same output. Used to resume, and by ``if_exists: skip``; with
    ``items`` (those of one period), the identity of that period's files (``if_exists: update``)."""
    from rasterflow import __version__

    digest = hashlib.sha256()
    digest.update(plan.spec_sha256.encode())
    items = [[item.get("id"), (item.get("properties") or {}).get("updated")]
             for item in (plan.items if period_items is None else period_items)]
    digest.update(json.dumps(items, default=str).encode())
    # a period's files do not depend on how many items other periods have (the whole time axis' chunk length)
    chunks = plan.chunks if period_items is None else {k: v for k, v in plan.chunks.items() if k != "time"}
    digest.update(json.dumps([plan.grid.bounds, plan.grid.shape, chunks]).encode())
    digest.update(__version__.encode())
    return digest.hexdigest()[:32]


def plan_command(loaded: LoadedSpec, *, now: dt.datetime | None = None) -> PlanResult:
    """``rasterflow plan``: search, resolve, estimate (nothing printed; the CLI renders the result)."""
    items = search(loaded, now)
    layout = resolve_layout(loaded.spec)
    plan = plan_with_items(loaded, items, layout)
    layout, plan = processes_if_refused(loaded, items, layout, plan)
    code = ExitCode.OK if plan.report.ok else ExitCode.OVER_BUDGET
    return PlanResult(loaded=loaded, plan=plan, payload=plan_payload(loaded, plan), exit_code=int(code))


def plan_payload(loaded: LoadedSpec, plan: JobPlan) -> dict[str, Any]:
    """The plan as plain JSON values (``plan --json``)."""
    layout = plan.layout
    return {
        "spec": str(loaded.path),
        "name": plan.name,
        "items": len(plan.items),
        "item_ids": [item["id"] for item in plan.items],
        "grid": {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                 "transform": list(plan.grid.transform)},
        "layout": {"n_workers": layout.n_workers, "threads_per_worker": layout.threads_per_worker,
                   "memory_limit": layout.memory_limit, "source": layout.source},
        "assets": assets_applied(plan),
        "budget": plan.report.to_dict(),
        # what the tasks hold and read (the chunk index; the items' declared grids): no file was opened for these
        "items_per_task": plan.report.inputs.items_per_task,
        "cost": None if plan.cost is None else dataclasses.asdict(plan.cost),
        # per statistic of the reduction, its terms in the budget's reduce stage (rasterflow.statcost)
        "statistics": None if plan.statistics_cost is None else plan.statistics_cost.to_dict(),
    }


def assets_applied(plan: JobPlan) -> dict[str, dict[str, Any]]:
    """Per loaded asset: its key, the dtype it loads in and what metadata was applied (for how many items)."""
    if plan.sources is None:
        return {}
    return {a.name: {"key": a.key, "load_dtype": a.load_dtype, "applied": list(a.applied)} for a in plan.sources.assets}


def profile_command(loaded: LoadedSpec, *, flamegraph: str | None = None, use_memray: bool = True,
                    emit: Emit | None = None) -> list[str]:
    """``rasterflow profile``: one representative task in this process, measured vs the model's prediction; returns
    the lines to show."""
    from rasterflow.profile import profile_one_task

    emit = emit or no_emit
    plan = plan_with_items(loaded, search(loaded), local_layout(loaded.spec))
    if not plan.report.ok:
        emit("warning", {"message": "the budget check refuses this spec; profiling one task anyway"})
    result = profile_one_task(plan, use_memray=use_memray, flamegraph=flamegraph)
    return list(result.lines())
