"""The per-chunk read index (issue 13, step 4): each spatial chunk's task holds only the items whose files meet it.

A real 2 × 2 tile sample (``rasterflow.sample``: COGs written by rasterio, 96² px tiles, 4 dates) on chunks of 40 px
that do not divide the tiles, so chunks meet one, two or four tiles' items; one variant drops tile 0's July item so
that the July period has no item at all in that tile's chunks. Checked:

- the index lists, per chunk, exactly the items a brute-force footprint test (``AssetRead.intersects``) finds, its
  maxima are the brute-force counts, and the recount at another chunk size is the brute-force count there;
- the graph's tasks (``dict(array.__dask_graph__())``) carry ReadJobs with only those items;
- the results are equal, bit for bit, to tasks that hold every item (``graph.read_jobs``: the behaviour before the
  index), on the fused path (median, quantiles, a period with no item in some chunks, ``group_by: solar_day``, a
  band that gives a number where there is no data) and on the series path, and equal to an independent NumPy
  reference (rasterio + NumPy) for the median and the solar-day monthly median;
- the budget's time depth is the index's most items per chunk, and a single-tile plan's numbers are the old ones;
- building the index on ``benchmarks/plan_scale.py``'s synthetic job is linear: 4× the files cost < 6× the time.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import spec_text
from reference import assert_same, load_items, masked_ndvi, reduce_reference

from rasterflow import budget, graph, kernels
from rasterflow.planning import build_chunk_index, make_plan
from rasterflow.read import ReadJob, read_planes
from rasterflow.sizing import WorkerLayout
from rasterflow.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CHUNK = 40
LAYOUT = WorkerLayout(n_workers=2, threads_per_worker=1, memory_limit=2 * 10**9, source="local")


@pytest.fixture(scope="session")
def row_of_tiles(tmp_path_factory):
    """1 × 4 adjacent tiles of 64² px, 4 dates: 16 items, a chunk meets at most two tiles' (8)."""
    from rasterflow.sample import generate_sample

    return generate_sample(tmp_path_factory.mktemp("row-of-tiles"), size=64, n_dates=4, tiles=(1, 4), blocksize=32)


@pytest.fixture(scope="session")
def without_july_tile0(four_tiles, tmp_path_factory) -> Path:
    """The sample's items without tile 0's July item: July has no item in tile 0's chunks."""
    items = json.loads(Path(four_tiles.items_json).read_text())
    items["features"] = [f for f in items["features"]
                         if not (f["id"].endswith("_0_L2A") and f["properties"]["datetime"].startswith("2024-07"))]
    path = tmp_path_factory.mktemp("no-july") / "items.json"
    path.write_text(json.dumps(items))
    return path


def _plan(sample, tmp_path: Path, *, catalog: Path | None = None, **kwargs):
    spec = tmp_path / "spec.yaml"
    kwargs.setdefault("chunks", f"{{time: -1, y: {CHUNK}, x: {CHUNK}}}")
    spec.write_text(spec_text(sample, catalog=str(catalog) if catalog else None, **kwargs))
    loaded = load_spec(spec)
    items = load_items(sample) if catalog is None else sorted(
        json.loads(catalog.read_text())["features"], key=lambda i: (i["properties"]["datetime"], i["id"]))
    return make_plan(loaded.spec, items=items, layout=LAYOUT)


def _windows(plan):
    cy, cx = plan.chunks["y"], plan.chunks["x"]
    height, width = plan.grid.shape
    for i, r0 in enumerate(range(0, height, cy)):
        for j, c0 in enumerate(range(0, width, cx)):
            yield i, j, (r0, min(r0 + cy, height)), (c0, min(c0 + cx, width))


def _brute_items(plan, rows, cols) -> list[int]:
    return [t for t, reads in enumerate(plan.sources.reads) if any(r.intersects(rows, cols) for r in reads)]


def _all_items_result(plan) -> dict[str, np.ndarray]:
    """What the tasks computed before the index: every item on every chunk (``graph.read_jobs``), as the
    dataset's variables."""
    program = plan.program
    height, width = plan.grid.shape
    out = np.empty((program.n_groups, program.n_quantiles, len(program.bands), height, width), dtype=program.dtype)
    for _, _, rows, cols in _windows(plan):
        job = graph.read_jobs(plan, slice(0, len(plan.items)), rows, cols)
        out[..., rows[0]:rows[1], cols[0]:cols[1]] = kernels.reduce_block(read_planes(job, rows, cols), program)
    index = (slice(None) if plan.period_labels else 0, slice(None) if plan.quantile_dim else 0)
    return {name: out[index + (b,)] for b, name in enumerate(program.band_names)}


def _fused_tasks(dataset_array) -> dict:
    return {key: task for key, task in dict(dataset_array.__dask_graph__()).items()
            if isinstance(task, tuple) and task and task[0] in (graph.chunk_reduce, graph.chunk_bands)}


# ---- the index --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_by", [None, "solar_day"])
def test_index_lists_the_items_whose_files_meet_each_chunk(four_tiles, without_july_tile0, tmp_path, group_by):
    plan = _plan(four_tiles, tmp_path, catalog=without_july_tile0, group_by=group_by,
                 reduce="{method: median, period: month}")
    index = plan.chunk_index
    assert index.chunk_yx == (CHUNK, CHUNK) and index.n_chunks == (5, 5)
    step_of = {t: d for d, indices in enumerate(plan.program.steps) for t in indices}
    counts, dates, files = [], [], []
    for i, j, rows, cols in _windows(plan):
        expected = _brute_items(plan, rows, cols)
        assert index.items_of(i, j).tolist() == expected, (i, j)
        counts.append(len(expected))
        dates.append(len({step_of.get(t, t) for t in expected}))
        # the files a task reads: footprints without their pixel of margin (the rule of the former _files_per_chunk)
        n = 0
        for reads in plan.sources.reads:
            for read in reads:
                r0, r1, c0, c1 = read.footprint
                r0, r1 = (r0 + 1, r1 - 1) if r1 - r0 > 2 else (r0, r1)
                c0, c1 = (c0 + 1, c1 - 1) if c1 - c0 > 2 else (c0, c1)
                n += r0 < rows[1] and rows[0] < r1 and c0 < cols[1] and cols[0] < c1
        files.append(n)
    n_items = len(plan.items)
    assert n_items == 15
    # interior chunks meet one tile (its 4 or 3 dates), chunks over a tile edge two or four tiles
    assert min(counts) == 3 and max(counts) == n_items and sorted(set(counts)) == [3, 4, 7, 8, 15]
    assert index.counts().reshape(-1).tolist() == counts
    assert index.most_items == max(counts) and index.most_dates == max(dates) and index.most_files == max(files)
    if group_by:
        assert index.most_dates == len(plan.times) == 4 < index.most_items
    # another chunk size (the fix solver's candidates): counted from the boxes, equal to the brute force here
    for side in (32, 64):
        other = dataclasses.replace(plan, report=dataclasses.replace(
            plan.report, inputs=dataclasses.replace(plan.report.inputs, chunk_y=side, chunk_x=side)))
        brute = max(len(_brute_items(other, rows, cols)) for _, _, rows, cols in _windows(other))
        assert index.depth(side, side).items == brute


def test_tasks_hold_only_the_items_meeting_their_chunk(four_tiles, tmp_path):
    plan = _plan(four_tiles, tmp_path, reduce="{method: median}")
    dataset = graph.build_dataset(plan)
    tasks = _fused_tasks(dataset["ndvi"].data)
    assert len(tasks) == 25
    windows = {(i, j): (rows, cols) for i, j, rows, cols in _windows(plan)}
    sizes = []
    for key, task in tasks.items():
        function, job, rows, cols, program, view, *_ = task
        assert function is graph.chunk_reduce and isinstance(job, ReadJob)
        i, j = key[-2:]
        assert (rows, cols) == windows[(i, j)]
        expected = _brute_items(plan, rows, cols)
        assert [reads[0].item_id for reads in job.reads] == [plan.items[t]["id"] for t in expected]
        assert view.dates == tuple(expected) and view.n_dates == len(plan.items) == 16
        sizes.append(len(job.reads))
    # a chunk inside one tile holds its 4 items, not 16 (12 of them were None before)
    assert sorted(set(sizes)) == [4, 8, 16] and sizes.count(4) == 16 and sizes.count(8) == 8


# ---- the results ------------------------------------------------------------------------------------------------

CASES = {
    "median": dict(reduce="{method: median}"),
    "quantiles by month, July missing in tile 0": dict(reduce="{method: quantile, q: [0.1, 0.5, 0.9], period: month}",
                                                       missing=True),
    "solar-day median by month, July missing in tile 0": dict(reduce="{method: median, period: month}",
                                                              group_by="solar_day", missing=True),
    "numbers where no data: mean and count by month": dict(
        reduce="{method: mean, period: month}", missing=True,
        bands='ndvi: "(nir - red) / (nir + red)"\nwet: "where(isnan(nir), -1, nir > red)"'),
    "numbers where no data, solar day": dict(
        reduce="{method: count, period: month}", missing=True, group_by="solar_day",
        bands='wet: "where(isnan(nir), -1, nir > red)"'),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_results_equal_tasks_holding_every_item(four_tiles, without_july_tile0, tmp_path, case):
    options = dict(CASES[case])
    catalog = without_july_tile0 if options.pop("missing", False) else None
    plan = _plan(four_tiles, tmp_path, catalog=catalog, **options)
    dataset = graph.build_dataset(plan).compute(scheduler="synchronous")
    before = _all_items_result(plan)
    for name, expected in before.items():
        np.testing.assert_array_equal(dataset[name].values, expected, err_msg=name)  # NaN where NaN, else bitwise
    if catalog is not None and plan.period_labels and "bands" not in options:
        # July in tile 0's chunks: no item; the period is what an all-NaN series gives
        july = plan.period_labels.index("2024-07")
        for name in before:
            assert np.isnan(dataset[name].values[july, ..., :CHUNK, :CHUNK]).all()


def _placed_ndvi(sample, items) -> np.ndarray:
    """Per item, its masked NDVI placed on the union grid, NaN elsewhere (rasterio + NumPy only)."""
    minx, miny, maxx, maxy = sample.bounds
    height, width = int(round((maxy - miny) / 10)), int(round((maxx - minx) / 10))
    out = np.full((len(items), height, width), np.nan, dtype=np.float32)
    for t, item in enumerate(items):
        ndvi = masked_ndvi([item])[0]
        with rasterio.open(item["assets"]["red"]["href"]) as src:
            col, row = int(round((src.transform.c - minx) / 10)), int(round((maxy - src.transform.f) / 10))
        out[t, row:row + ndvi.shape[0], col:col + ndvi.shape[1]] = ndvi
    return out


def test_median_equals_the_numpy_reference_on_real_processes(four_tiles, tmp_path):
    plan = _plan(four_tiles, tmp_path, reduce="{method: median}")
    # the process scheduler pickles every task: the ReadJobs and TaskItems travel as they would to workers
    result = graph.build_dataset(plan)["ndvi"].compute(scheduler="processes", num_workers=2).values
    assert_same(result, reduce_reference(_placed_ndvi(four_tiles, load_items(four_tiles)), "median"))


def test_solar_day_monthly_median_equals_the_numpy_reference(four_tiles, without_july_tile0, tmp_path):
    plan = _plan(four_tiles, tmp_path, catalog=without_july_tile0, group_by="solar_day",
                 reduce="{method: median, period: month}")
    result = graph.build_dataset(plan)["ndvi"].compute(scheduler="synchronous").values
    items = sorted(json.loads(without_july_tile0.read_text())["features"],
                   key=lambda i: (i["properties"]["datetime"], i["id"]))
    placed = _placed_ndvi(four_tiles, items)
    days = sorted({item["properties"]["datetime"][:10] for item in items})
    mosaic = np.full((len(days), *placed.shape[1:]), np.nan, dtype=np.float32)
    for t, item in enumerate(items):  # tiles do not overlap: the pass is their union
        target = mosaic[days.index(item["properties"]["datetime"][:10])]
        np.copyto(target, placed[t], where=np.isnan(target))
    labels = np.array([d[:7] for d in days])
    expected = np.stack([reduce_reference(mosaic[labels == m], "median") for m in ("2024-06", "2024-07")])
    assert plan.period_labels == ("2024-06", "2024-07", "2024-08")  # every month of the window; August empty
    assert_same(result[:2], expected)
    assert np.isnan(result[2]).all()
    assert np.isnan(result[1, :CHUNK, :CHUNK]).all()  # July: no item in tile 0's chunks


@pytest.mark.parametrize("group_by", [None, "solar_day"])
def test_series_path_equals_tasks_holding_every_item(four_tiles, without_july_tile0, tmp_path, group_by):
    """No reduction, time chunked by 3 (or whole with solar_day): every date comes out, the dates without an item
    in a chunk as the band math gives for no data (NaN, or -1 here)."""
    plan = _plan(four_tiles, tmp_path, catalog=without_july_tile0, group_by=group_by,
                 chunks=f"{{time: {-1 if group_by else 3}, y: {CHUNK}, x: {CHUNK}}}",
                 bands='ndvi: "(nir - red) / (nir + red)"\nwet: "where(isnan(nir), -1, nir)"')
    dataset = graph.build_dataset(plan)
    tasks = _fused_tasks(dataset["ndvi"].data)
    assert max(len(task[1].reads) for task in tasks.values()) <= (3 if not group_by else len(plan.items))
    values = dataset.compute(scheduler="synchronous")
    n_items = len(plan.items)
    edges = [(0, n_items)] if group_by else [(t, min(t + 3, n_items)) for t in range(0, n_items, 3)]
    for _, _, rows, cols in _windows(plan):
        blocks = [kernels.band_block(read_planes(graph.read_jobs(plan, slice(t0, t1), rows, cols), rows, cols),
                                     plan.program) for t0, t1 in edges]
        before = np.concatenate(blocks)
        for b, name in enumerate(plan.program.band_names):
            np.testing.assert_array_equal(values[name].values[:, rows[0]:rows[1], cols[0]:cols[1]], before[:, b])
    assert (values["wet"].values == -1).any()


# ---- the budget -------------------------------------------------------------------------------------------------


def test_budget_time_depth_is_the_most_items_of_one_chunk(row_of_tiles, tmp_path):
    plan = _plan(row_of_tiles, tmp_path, reduce="{method: median}", chunks="{time: -1, y: 32, x: 32}")
    inputs = plan.report.inputs
    # a chunk at a tile edge meets both tiles (a footprint's pixel of margin), none meets three
    assert plan.chunk_index.most_items == 8 < len(plan.items) == 16
    assert inputs.items_per_task == 8 and inputs.n_time == 16
    load = plan.report.stages[0]
    assert load.stage == "load" and "8 items one by one" in load.detail
    task = budget.task_shapes(plan.shape, inputs)[0]
    assert (task.items, task.dates) == (8, 8)
    # the same job as if every item met every chunk (the model before the index): a series of 16 dates, not 8
    flat = budget.estimate(plan.shape, dataclasses.replace(inputs, chunk_depth=None))
    mask = next(s for s in plan.report.stages if s.stage == "mask")
    flat_mask = next(s for s in flat.stages if s.stage == "mask")
    assert flat_mask.bytes_per_task - mask.bytes_per_task == 8 * 32 * 32 * 4
    assert flat.peak_per_worker > plan.report.peak_per_worker


def test_single_tile_budget_is_unchanged(sample, tmp_path):
    plan = _plan(sample, tmp_path, reduce="{method: median, period: month}", chunks="{time: -1, y: 96, x: 96}")
    inputs = plan.report.inputs
    assert plan.chunk_index.most_items == len(plan.items) == inputs.items_per_task == inputs.time_per_chunk
    before = budget.estimate(plan.shape, dataclasses.replace(inputs, chunk_depth=None))
    after = budget.estimate(plan.shape, inputs)
    assert after.stages == before.stages and after.peak_per_worker == before.peak_per_worker
    assert after.to_dict() == before.to_dict()


# ---- at scale ---------------------------------------------------------------------------------------------------


def _bench():
    spec = importlib.util.spec_from_file_location("plan_scale", REPO / "benchmarks" / "plan_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_index_building_is_linear_in_files(tmp_path):
    from rasterflow.commands import plan_command

    bench = _bench()
    timings, indexes = [], []
    for n_tiles in (10, 40):
        loaded = load_spec(bench.write_job(tmp_path / str(n_tiles), n_tiles, 73, chunk=1024))
        plan = plan_command(loaded).plan
        best = None
        for _ in range(3):
            started = time.perf_counter()
            index = build_chunk_index(plan.sources, plan.grid.shape, (1024, 1024), steps=plan.program.steps)
            seconds = time.perf_counter() - started
            best = seconds if best is None else min(best, seconds)
        timings.append(best)
        indexes.append((index, plan))
    print(f"index: 10 tiles {timings[0]:.3f} s, 40 tiles {timings[1]:.3f} s")
    assert timings[1] < 6 * timings[0]
    for index, plan in indexes:
        assert index.most_items == plan.chunk_index.most_items
        # a chunk meets at most the 4 tiles around a corner (10% overlap), each with its 73 dates
        assert 73 <= index.most_items <= 4 * 73 and index.most_dates <= len(plan.times)
        assert plan.report.inputs.items_per_task == index.most_items < len(plan.items)


@pytest.mark.parametrize("method", ["median", "count", "sum"])
def test_a_chunk_no_item_meets_is_what_an_all_nan_series_gives(method):
    """A task with no item (a chunk outside every file): each period is the reduction of all-NaN dates, as when
    every item was loaded as nodata; with a band that gives a number for no data, that number on every date."""
    from rasterflow.expr import parse_expression

    bands = (("ndvi", parse_expression("(nir - red) / (nir + red)", ["red", "nir"], what="band")),
             ("flag", parse_expression("where(isnan(nir), 2, 0)", ["red", "nir"], what="band")))
    program = kernels.Program(assets=("red", "nir"), mask=None, masked_assets=(), bands=bands, dtype="float32",
                              reduce_method=method, groups=((0, 1), (2,)))
    empty = kernels.Planes(raw=(np.zeros((0, 3, 4), np.uint16),) * 2, covered=(None, None), nodata=np.zeros((0, 2)),
                           scale=np.ones((0, 2)), offset=np.zeros((0, 2)))
    view = kernels.task_items(program, [], 0, 3)
    out = kernels.reduce_block(empty, program, view)
    assert out.shape == (2, 1, 2, 3, 4)
    nan_series = np.full((3, 3, 4), np.nan, dtype=np.float32)
    for group, dates in enumerate(program.groups):
        ndvi = kernels.reduce_time(nan_series[: len(dates)], method)[0]
        flag = kernels.reduce_time(np.full((len(dates), 3, 4), 2, dtype=np.float32), method)[0]
        np.testing.assert_array_equal(out[group, 0, 0], ndvi)
        np.testing.assert_array_equal(out[group, 0, 1], flag)
    series = kernels.band_block(empty, program, view)
    assert series.shape == (3, 2, 3, 4) and np.isnan(series[:, 0]).all() and (series[:, 1] == 2).all()


def test_plan_prints_the_items_a_task_holds(row_of_tiles, tmp_path):
    from click.testing import CliRunner

    from rasterflow.cli import cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(row_of_tiles, reduce="{method: median}", chunks="{time: -1, y: 32, x: 32}"))
    result = CliRunner().invoke(cli, ["plan", str(spec)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.strip().startswith("chunk "))
    assert "time 8 x y 32 x x 32" in line and "(at most 8 of 16 meet one chunk)" in line, line


def test_plan_json_carries_the_task_depth_and_the_cost(row_of_tiles, tmp_path):
    from click.testing import CliRunner

    from rasterflow.cli import cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(row_of_tiles, reduce="{method: median}", chunks="{time: -1, y: 32, x: 32}"))
    result = CliRunner().invoke(cli, ["plan", "--json", str(spec)])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["items_per_task"] == 8 and payload["items"] == 16
    cost = payload["cost"]
    # 4 tiles of 64² px side by side, 4 dates, 3 assets: every source pixel lies inside the grid once
    height, width = payload["grid"]["shape"]
    assert cost["files"] == 16 * 3 and cost["tasks"] == payload["budget"]["task_count"]
    assert cost["pixels_read"] == 4 * 3 * 4 * 64 * 64 == 4 * 3 * height * width
    assert cost["bytes_read"] == 4 * 4 * 64 * 64 * (2 + 2 + 1)  # red, nir uint16; scl uint8
    assert cost["wall_seconds"] > 0


# ---- sub-blocks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block, across", [((7, 13), False), ((40, 9), False), ((16, 40), False), ((7, 13), True),
                                           ((16, 9), True)])
@pytest.mark.parametrize("case", list(CASES))
def test_sub_blocks_give_the_whole_chunks_result(four_tiles, without_july_tile0, tmp_path, case, block, across):
    """A fused task reduced in sub-blocks (``budget.sub_block``: deep series) is bit for bit the task reduced whole,
    for sub-blocks that divide the 40² chunks and ones that leave a remainder, at the edge chunks too, taken down
    each column of them or across each row (``budget.sub_blocks_across``: the remote reader's order)."""
    options = dict(CASES[case])
    catalog = without_july_tile0 if options.pop("missing", False) else None
    plan = _plan(four_tiles, tmp_path, catalog=catalog, **options)
    assert plan.report.sub_block == (0, 0) and not plan.sub_blocks_across
    inputs = dataclasses.replace(plan.report.inputs, remote_fetch=across)
    blocked = dataclasses.replace(plan, report=dataclasses.replace(plan.report, sub_block=block, inputs=inputs))
    assert blocked.sub_blocks_across is across
    tasks = _fused_tasks(graph.build_dataset(blocked)[plan.program.band_names[0]].data)
    assert tasks and all(task[-2:] == (block, across) for task in tasks.values())
    dataset = graph.build_dataset(blocked).compute(scheduler="synchronous")
    for name, expected in _all_items_result(plan).items():
        np.testing.assert_array_equal(dataset[name].values, expected, err_msg=name)


def test_plan_counts_one_request_per_row_of_tiles_when_remote_sub_blocks_go_across(sample, tmp_path):
    """``plan``'s remote requests: per file and chunk one per row of the chunk's tiles when the sub-blocks are
    taken across each row of them (the concurrent reader's order), one per tile of a row when they go down each
    column of one tile's width (each column fetches its tiles apart)."""
    from rasterflow.planning.cost import RemoteProbe, remote_cost

    plan = _plan(sample, tmp_path, chunks="{time: -1, y: 256, x: 256}")  # one chunk: 2 x 2 tiles of 128²
    assert plan.sources is not None
    probe = RemoteProbe(round_trip=0.04, bytes_per_pixel=0.5, decodable=True)
    files = sum(read is not None for reads in plan.sources.reads for read in reads)

    def requests(across: bool) -> int:
        inputs = dataclasses.replace(plan.report.inputs, remote_fetch=across, source_tile=(128, 128))
        report = dataclasses.replace(plan.report, sub_block=(128, 128), inputs=inputs)
        return remote_cost(plan.sources, report, plan.layout, plan.chunk_index, probe, files, 0, 0, 64).requests

    headers = min(files, files * plan.layout.n_workers)
    assert requests(True) == headers + files * 2  # a row of tiles per request
    assert requests(False) == headers + files * 4  # a tile per request


def test_plans_wall_counts_the_remote_readers_own_cpu_on_the_tasks_threads(sample, tmp_path):
    """The reader's CPU for the compressed bytes it fetches (CLIENT_CPU_SECONDS_PER_GB) runs on the tasks' cores:
    the wall estimate's compute is the chunks' decode plus that, over the threads."""
    from rasterflow.planning.cost import (
        CLIENT_CPU_SECONDS_PER_GB, DECODED_PX_PER_SECOND_PER_THREAD, STARTUP_SECONDS, RemoteProbe, job_cost,
    )

    plan = _plan(sample, tmp_path, chunks="{time: -1, y: 256, x: 256}")
    assert plan.sources is not None
    # a fat source (100 bytes a pixel) at 1 ms a request: the reader's CPU, not the waiting or the scheduler, sets
    # the wall
    probe = RemoteProbe(round_trip=0.001, bytes_per_pixel=100.0, decodable=True)
    report = dataclasses.replace(plan.report, inputs=dataclasses.replace(plan.report.inputs, remote_fetch=True))
    local = job_cost(plan.sources, plan.grid, plan.report, plan.layout, plan.chunk_index)
    remote = job_cost(plan.sources, plan.grid, report, plan.layout, plan.chunk_index, probe, concurrency=64)
    assert local.remote is None and remote.remote is not None
    assert remote.remote.bytes == int(remote.pixels_read * 100.0)
    client = remote.remote.bytes / 1e9 * CLIENT_CPU_SECONDS_PER_GB
    assert remote.remote.client_seconds == pytest.approx(client)
    decode = remote.pixels_read / DECODED_PX_PER_SECOND_PER_THREAD
    assert remote.wall_seconds - STARTUP_SECONDS == pytest.approx(max((decode + client) / remote.threads,
                                                                      remote.remote.network_seconds,
                                                                      remote.tasks * 1e-3))
    assert remote.wall_seconds > local.wall_seconds + client / remote.threads / 2
    assert "CPU-s of the reader's own" in remote.remote.summary()
