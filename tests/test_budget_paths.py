"""The memory model per code path (issue 10), with hand-computed numbers; the streaming std kernel against NumPy;
the static check's stated assumptions; fixes that pass when pasted (and one that runs within its limit); a failed
run's report with memory samples."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from rasterflow import budget, kernels
from rasterflow.cli import cli
from rasterflow.expr import parse_expression
from rasterflow.planning import make_plan
from rasterflow.spec import load_spec_text
from rasterflow.spec.models import Spec

MB = 10**6
GB = 10**9
NDVI = parse_expression("(nir - red) / (nir + red)", ["red", "nir", "scl"], what="band")
MASK = parse_expression("scl in (3, 8, 9, 10)", ["red", "nir", "scl"], what="mask")


def _shape(method: str | None = "median", *, bands: int = 1, period: bool = False, mosaic: bool = False,
           fmt: str = "zarr", quantiles: int = 0) -> budget.PipelineShape:
    return budget.PipelineShape(
        assets_loaded=("red", "nir", "scl"), mask=MASK, masked_assets=("red", "nir"),
        bands=tuple((f"b{i}", NDVI) for i in range(bands)), reduce_method=method, n_quantiles=quantiles,
        has_period=period, mosaics_passes=mosaic, output_format=fmt)


def _inputs(**changes) -> budget.BudgetInputs:
    base = budget.BudgetInputs(
        grid_shape=(2048, 2048), n_time=16, time_source="search", chunk_time=-1, chunk_y=1024, chunk_x=1024,
        dtype="float32", threads_per_worker=1, n_workers=1, memory_limit=8 * GB, limit_source="spec",
        gdal_cachemax=64 * MB, max_fraction=0.5, asset_dtypes=("uint16", "uint16", "uint8"))
    return dataclasses.replace(base, **changes)


PX = 1024 * 1024
ONE = PX * 4  # one date of one band, float32
ITEM = PX * (2 + 2 + 1)  # one item of red, nir (uint16) and scl (uint8): the reader hands the kernel one at a time


# --- per path, by hand ----------------------------------------------------------------------------------------------


@pytest.fixture
def whole_chunks(monkeypatch):
    """Fused tasks reduce their chunk whole (sub-blocks have their own tests below)."""
    monkeypatch.setattr(budget, "STRIP_TARGET_BYTES", 10 * GB)


def test_fused_median_holds_block_series_and_one_date_temporaries(whole_chunks):
    report = budget.estimate(_shape("median"), _inputs())
    assert report.path == "fused"
    stages = {s.stage: s.bytes_per_task for s in report.stages}
    held = ITEM + 16 * ONE  # one item's raw planes + the ndvi series of 16 dates
    assert stages["load"] == ITEM
    assert report.sub_block == (0, 0)
    # mask: scl (uint8) is masked with a per-value table gathered with each asset, so only red and nir as one-date
    # working planes (kernels._masked_assets; scl stays raw)
    assert stages["mask"] == held + 2 * ONE
    # ndvi: red, nir, nir-red and nir+red; the quotient is written into the series
    assert stages["band b0"] == held + 4 * ONE
    assert stages["reduce median"] == int(held + 0.1 * 16 * ONE + ONE)  # bottleneck's result + the output plane
    assert stages["write"] == int(ONE + budget.ZARR_WRITE_PLANES * ONE)  # the result + zarr's buffers
    # 4 chunks for 1 worker and 1 thread: one task at a time; 48 files open; the cache fills (decodes 84 MB a chunk)
    assert report.concurrent_tasks == 1 and report.gdal_cache_bytes == 64 * MB
    # no finished result waits for its write: the Zarr writer runs a chunk's reduction and its write as one task
    assert report.held_bytes == 0
    assert report.peak_per_worker == held + 4 * ONE + 48 * budget.OPEN_FILE_BYTES + 64 * MB \
        + budget.WORKER_BASELINE_BYTES


def test_threads_are_capped_by_the_tasks_a_worker_gets():
    # one 2048² chunk on a worker with 3 threads: only one task ever runs (issue: predicted 1.91x the measured peak)
    one_chunk = _inputs(chunk_y=2048, chunk_x=2048, threads_per_worker=3)
    report = budget.estimate(_shape("mean"), one_chunk)
    assert report.concurrent_tasks == 1
    assert report.tasks_bytes == report.peak_task_bytes
    assert report.peak_per_worker == report.peak_task_bytes + report.open_files_bytes + 64 * MB \
        + budget.WORKER_BASELINE_BYTES
    # 4 chunks on 2 workers × 3 threads: 2 tasks each
    report = budget.estimate(_shape("mean"), _inputs(threads_per_worker=3, n_workers=2))
    assert report.concurrent_tasks == 2


def test_edge_chunks_count_at_their_real_size(whole_chunks):
    # 2048² cut at 1536: chunks 1536², 1536×512, 512×1536, 512²; two threads hold the two largest at once
    inputs = _inputs(chunk_y=1536, chunk_x=1536, threads_per_worker=2)
    shapes = budget.task_shapes(_shape("median"), inputs)
    assert [(t.rows, t.cols, t.count) for t in shapes] == [(1536, 1536, 1), (1536, 512, 1), (512, 1536, 1),
                                                           (512, 512, 1)]
    report = budget.estimate(_shape("median"), inputs)
    small = dataclasses.replace(inputs, grid_shape=(1536, 512), chunk_y=1536, chunk_x=512)
    big = dataclasses.replace(inputs, grid_shape=(1536, 1536))
    second = budget.estimate(_shape("median"), small)
    block = second.stages[0].bytes_per_task
    # the largest at its peak, the second with its block and 0.6 of the rest (budget.CONCURRENT_RAMP); no finished
    # result waits for its write (a chunk's reduction and its write are one task for Zarr)
    assert report.held_bytes == 0
    running = report.tasks_bytes
    assert running == budget.estimate(_shape("median"), big).peak_task_bytes \
        + int(block + budget.CONCURRENT_RAMP * (second.peak_task_bytes - block))
    # not twice the full chunk
    assert running < 2 * report.peak_task_bytes * 0.7


def test_gdal_cache_is_capped_by_the_bytes_a_worker_decodes():
    # 512² chunks on a 1024² grid, 16 items, 5 B per item and pixel: the worker decodes 16 × 1024² × 5 = 83.9 MB,
    # so a 256 MB cache holds 83.9 MB (issue: the demo was predicted 2x its peak with the cache assumed full)
    inputs = _inputs(grid_shape=(1024, 1024), chunk_y=512, chunk_x=512, gdal_cachemax=256 * MB)
    report = budget.estimate(_shape("median"), inputs)
    assert report.gdal_cache_bytes == 16 * 1024 * 1024 * 5
    # with 2 workers each decodes half
    assert budget.estimate(_shape("median"), dataclasses.replace(inputs, n_workers=2)).gdal_cache_bytes \
        == 16 * 1024 * 1024 * 5 // 2
    # source tiles of 768 px: a 512² window decodes whole 768² tiles
    tiled = dataclasses.replace(inputs, source_tile=(768, 768))
    assert budget.estimate(_shape("median"), tiled).gdal_cache_bytes == 4 * 16 * 768 * 768 * 5


def test_open_files_are_bounded_by_the_readers_lru():
    report = budget.estimate(_shape("median"), _inputs(n_time=400))
    assert report.open_files_bytes == budget.MAX_OPEN_PER_THREAD * budget.OPEN_FILE_BYTES  # not 1200 files


def test_tree_std_counts_partials_not_float64_copies():
    # time chunked by 4: 4 band-block tasks per spatial chunk, each 4 items deep
    inputs = _inputs(chunk_time=4)
    report = budget.estimate(_shape("std"), inputs)
    assert report.path == "tree"
    stages = {s.stage: s.bytes_per_task for s in report.stages}
    series4 = 4 * ONE
    assert stages["load"] == ITEM
    assert stages["bands out"] == ITEM + series4 + series4
    # the band's block + std_partials' 8 one-date temporaries + its (count, mean, M2 (+1)) partial
    assert stages["reduce std (tree)"] == series4 + 8 * ONE + 4 * ONE
    assert stages["combine std (tree)"] == 4 * 4 * ONE + 2 * ONE
    # held between tasks: a finished block and the partials of 4 time chunks waiting
    assert report.held_bytes == series4 + 4 * 4 * ONE
    assert report.peak_task_bytes == 18 * ONE and report.tasks_bytes == 38 * ONE  # 159 MB
    # da.nanstd's float64 copies (~8 planes of the 4-date series above the input) would be 134 MB per task alone
    assert report.tasks_bytes < 8 * 2 * series4 + series4 + 16 * ONE


def test_tree_mean_partials_two_planes_count_one():
    mean = budget.estimate(_shape("mean"), _inputs(chunk_time=4))
    count = budget.estimate(_shape("count"), _inputs(chunk_time=4))
    # tasks.tree_partials: mean keeps the total and the valid count (2 one-date planes of the working dtype per time
    # chunk), count the valid count alone (1 plane)
    for report, method, planes in ((mean, "mean", 2), (count, "count", 1)):
        stages = {s.stage: s.bytes_per_task for s in report.stages}
        assert stages[f"combine {method} (tree)"] == 4 * planes * ONE + 2 * ONE
        assert report.held_bytes == 4 * ONE + 4 * planes * ONE


def test_series_holds_a_finished_block_while_it_is_written():
    # time whole and one band: a chunk's one write follows its band task on the same thread, nothing waits
    # (budget.series_held; budget_accuracy.py rows 18 and 25)
    report = budget.estimate(_shape(None), _inputs())
    assert report.path == "series"
    stages = {s.stage: s.bytes_per_task for s in report.stages}
    load = ITEM + 16 * ONE
    assert stages["bands out"] == load + 16 * ONE
    assert stages["mask"] == load + 2 * ONE  # red and nir as working planes; scl's table mask has no plane
    assert stages["band b0"] == load + 4 * ONE
    assert report.held_bytes == 0
    assert report.tasks_bytes == load + 16 * ONE
    # two bands: a block more than the stages count (row 20, measured)
    two = budget.estimate(_shape(None, bands=2), _inputs())
    assert two.path == "series"
    assert two.held_bytes == 2 * 16 * ONE
    # time in chunks, to Zarr: each band task and its dates' writes are one task, nothing waits on one thread; two
    # threads count a block each (row 19, measured)
    chunked = budget.estimate(_shape(None), _inputs(chunk_time=4))
    assert chunked.held_bytes == 0
    assert budget.estimate(_shape(None), _inputs(chunk_time=4, threads_per_worker=2)).held_bytes == 2 * 4 * ONE
    # to COG a chunk's time chunks are tasks of their own: their blocks wait for the chunk's writes
    assert budget.estimate(_shape(None, fmt="cog"), _inputs(chunk_time=4)).held_bytes > 0


def test_solar_day_sizes_series_by_passes_and_the_block_by_items(whole_chunks):
    # 24 items in 12 passes (two tiles per pass)
    inputs = _inputs(n_time=24, n_dates=12, chunk_time=4)
    shape = _shape("median", mosaic=True)
    report = budget.estimate(shape, inputs)
    assert report.path == "fused"  # solar_day reads every item in one task whatever chunks.time says
    (task,) = budget.task_shapes(shape, inputs)
    assert (task.items, task.dates, task.count) == (24, 12, 4)
    stages = {s.stage: s.bytes_per_task for s in report.stages}
    assert stages["load"] == ITEM  # 24 items, read one by one
    # mask: + the next tile's raw planes, its 2 working planes and the two boolean masks (0.5), beside the first
    # tile's 2 working planes (scl's table mask has no plane)
    assert stages["mask"] == int(ITEM + 12 * ONE + ITEM + (2 + 2.5) * ONE)


def test_coverage_planes_and_mixed_load_dtypes(whole_chunks):
    plain = budget.estimate(_shape("median"), _inputs())
    covered = budget.estimate(_shape("median"), _inputs(coverage_assets=2))
    assert covered.stages[0].bytes_per_task - plain.stages[0].bytes_per_task == 2 * PX  # bool, 1 B a pixel
    wide = budget.estimate(_shape("median"), _inputs(asset_dtypes=("uint16",) * 3))
    assert wide.stages[0].bytes_per_task - plain.stages[0].bytes_per_task == PX  # scl as uint16, not uint8


def test_periods_count_the_largest_period_subset():
    inputs = _inputs(group_dates=3, chunk_y=512, chunk_x=512)  # 512²: small enough to be reduced whole
    report = budget.estimate(_shape("quantile", period=True, quantiles=3), inputs)
    assert report.sub_block == (0, 0)
    stages = {s.stage: s.bytes_per_task for s in report.stages}
    one = ONE // 4
    held = ITEM // 4 + 16 * one
    # the subset copy (3 dates) + the sort's 0.5 of it + the result: ceil(16/3) = 6 periods × 3 quantiles
    assert stages["reduce quantile"] == int(held + 0.5 * 3 * one + 3 * one + 6 * 3 * one)


def test_one_process_runs_reduce_in_smaller_sub_blocks():
    """``processes: false`` shares its process with the client's libraries: its fused tasks reduce in sub-blocks of
    ONE_PROCESS_STRIP_TARGET_BYTES (8 MiB) where worker processes reduce a 1024² x 8 chunk whole, but never in
    strips thinner than a source tile (a window read per item and asset each, under one GIL: 2x the wall on a
    36-date season)."""
    shape = _shape("median")
    procs = _inputs(n_time=8, source_tile=(512, 512), threads_per_worker=2)
    one = dataclasses.replace(procs, one_process=True)
    assert budget.strip_target(procs) == budget.STRIP_TARGET_BYTES
    assert budget.strip_target(one) == budget.ONE_PROCESS_STRIP_TARGET_BYTES < budget.STRIP_TARGET_BYTES
    assert budget.sub_block(shape, procs) == (0, 0)
    assert budget.sub_block(shape, one) == (512, 512)  # one source tile: a whole tile is over the 8 MiB target
    report = budget.estimate(shape, one)
    assert report.sub_block == (512, 512)
    assert report.peak_task_bytes < budget.estimate(shape, procs).peak_task_bytes / 3
    # without known source tiles, full-width strips of the target as before
    untiled = dataclasses.replace(one, source_tile=None)
    rows, cols = budget.sub_block(shape, untiled)
    assert cols == 1024 and 16 <= rows < 512
    assert budget.estimate(shape, untiled).peak_task_bytes <= budget.ONE_PROCESS_STRIP_TARGET_BYTES + ONE
    # a deep series: strips of a tile in either layout, one process's no thinner than the worker processes' (the
    # task within STRIP_TARGET_BYTES, memory flat in the dates)
    deep = dataclasses.replace(procs, n_time=365)
    deep_rows = budget.sub_block(shape, deep)[0]
    assert 16 <= deep_rows < 512
    assert budget.sub_block(shape, dataclasses.replace(deep, one_process=True)) == (deep_rows, 512)
    assert budget.estimate(shape, dataclasses.replace(deep, one_process=True)).peak_task_bytes \
        <= budget.STRIP_TARGET_BYTES + ONE


def test_deep_series_are_reduced_in_sub_blocks_that_keep_the_task_flat():
    # 1024² chunks over 512² source tiles: 8 dates fit whole; deeper series in blocks of whole tiles, then strips
    # of one tile's width, every task under budget.STRIP_TARGET_BYTES (64 MiB) + the chunk's result (1 plane)
    shape = _shape("median")
    tiled = dict(source_tile=(512, 512))
    blocks = {n: budget.estimate(shape, _inputs(n_time=n, **tiled)) for n in (8, 16, 36, 73, 365)}
    assert {n: r.sub_block for n, r in blocks.items()} == {
        8: (0, 0), 16: (512, 1024), 36: (512, 512), 73: (256, 512), 365: (74, 512)}
    for n, report in blocks.items():
        assert report.peak_task_bytes <= budget.STRIP_TARGET_BYTES + ONE, n
    # a sub-block holds one item, its own series and temporaries, and the whole chunk's result (1 plane)
    rows, cols = blocks[36].sub_block
    part = rows * cols * 4
    stages = {s.stage: s.bytes_per_task for s in blocks[36].stages}
    assert stages["load"] == rows * cols * 5
    assert stages["mask"] == rows * cols * 5 + 36 * part + ONE + 2 * part  # red, nir; scl masks by table
    assert stages["band b0"] == rows * cols * 5 + 36 * part + ONE + 4 * part
    assert stages["reduce median"] == int(rows * cols * 5 + 36 * part + ONE + 0.1 * 36 * part + part)
    # the whole chunk at 73 dates would hold 4.9x the sub-blocked task
    assert ITEM + 73 * ONE + 6 * ONE > 4.5 * blocks[73].peak_task_bytes
    # no source tiles known: the fewest equal full-width strips that fit
    assert budget.estimate(shape, _inputs(n_time=36)).sub_block == (342, 1024)
    # the tree and series paths hold one time chunk and have no sub-blocks
    assert budget.estimate(shape, _inputs(n_time=36, chunk_time=4)).sub_block == (0, 0)
    assert budget.estimate(_shape(None), _inputs(n_time=36)).sub_block == (0, 0)


def test_cog_client_is_budgeted_and_checked_against_the_machine(monkeypatch):
    from rasterflow.write.cogassembly import TEMPLATE_CACHEMAX

    shape = _shape("median", fmt="cog")
    inputs = _inputs(machine_memory=16 * GB, n_workers=2, memory_limit=7 * GB, threads_per_worker=2)
    report = budget.estimate(shape, inputs)
    # the workers compress the tiles (chunks of 1024 cover whole 512² tiles): 4 chunks in flight, the client keeps
    # the 512² overview level (1 MB) and two working copies of it while it makes the smaller ones, GDAL's cache
    # while it makes the header
    layout = budget.cog_tile_layout(shape, inputs)
    assert layout is not None and layout.client_level == 2 and layout.levels[2] == (512, 512)
    level = 512 * 512 * 4
    assert report.client_peak == (budget.CLIENT_BASELINE_BYTES + budget.COG_WRITER_BYTES + 4 * ONE
                                  + (1 + budget.ASSEMBLY_LEVEL_COPIES) * level + TEMPLATE_CACHEMAX)
    assert report.ok
    # GDAL's copy instead (RASTERFLOW_COG_WRITER=gdal): 4 chunks, at most 2 × 4 threads in flight -> 4 blocks of
    # 1024² float32, then the COG copy of the 2048-px wide file on one core (more than the blocks); the 16.8 MB
    # output fits the cache
    monkeypatch.setenv("RASTERFLOW_COG_WRITER", "gdal")
    assert budget.cog_tile_layout(shape, inputs) is None
    report = budget.estimate(shape, inputs)
    copy = 2048 * 4 * budget.COG_COPY_ROWS
    assert copy > 4 * ONE
    assert report.client_peak == budget.CLIENT_BASELINE_BYTES + budget.COG_WRITER_BYTES + copy + 4 * PX * 4
    assert report.ok
    # workers take 15.8 GB of 16 GB: the client's ~0.3 GB does not fit beside them
    tight = budget.estimate(shape, dataclasses.replace(inputs, memory_limit=int(7.9 * GB)))
    assert not tight.ok
    assert any("COG writer" in r and "lower cluster.gdal_cachemax" in r for r in tight.refusals)
    # Zarr: the client holds no block
    assert budget.estimate(_shape("median"), inputs).client_peak == budget.CLIENT_BASELINE_BYTES


def test_task_count_follows_the_graph(sample, tmp_path):
    """The estimate against the real graph of the fused path (4 chunks, 1 band)."""
    from conftest import spec_text

    from reference import load_items

    from rasterflow import graph

    path = tmp_path / "s.yaml"
    path.write_text(spec_text(sample, reduce="{method: median}", chunks="{time: -1, y: 128, x: 128}"))
    loaded = load_spec_text(path.read_text(), path=path)
    plan = make_plan(loaded.spec, items=load_items(sample))
    dataset = graph.build_dataset(plan)
    graph_tasks = len(dataset["ndvi"].data.__dask_graph__())
    # the estimate adds a write per band and block and a few fixed tasks
    assert graph_tasks <= plan.report.task_count <= 3 * graph_tasks + 10


# --- the streaming std --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_std_partials_combined_in_any_split_match_numpy(dtype):
    rng = np.random.default_rng(7)
    values = (rng.random((23, 40, 30)) * 0.6 + 0.1).astype(dtype)
    values[rng.random(values.shape) < 0.35] = np.nan
    values[:, 0, 0] = np.nan  # never valid -> NaN
    values[:22, 1, 1] = np.nan  # one valid date -> 0
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        expected = np.nanstd(values.astype("float64"), axis=0)
    whole = kernels.finish_std(kernels.std_partials(values))
    parts = np.stack([kernels.std_partials(values[a:b]) for a, b in [(0, 1), (1, 9), (9, 10), (10, 23)]])
    split = kernels.finish_std(kernels.combine_std_partials(parts))
    for result in (whole, split):
        assert result.dtype == np.dtype(dtype)
        assert np.array_equal(np.isnan(result), np.isnan(expected))
        np.testing.assert_allclose(result, expected, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-7)
    assert whole[1, 1] == 0 and np.isnan(whole[0, 0])


@pytest.mark.parametrize("method", ["std", "mean", "sum", "count", "min", "max"])
def test_the_tree_reduction_matches_the_fused_kernel(method):
    """The tree path's _tree_reduce on a time axis in chunks of 5 (8 chunks: two combine levels) equals the time-whole
    reduction, NaN where no date is valid; with two periods, each is its own group."""
    import dask
    import dask.array as da

    from rasterflow.paths import tree as tree_path

    rng = np.random.default_rng(3)
    values = rng.random((37, 70, 65)).astype("float32")
    values[rng.random(values.shape) < 0.4] = np.nan
    values[:, :3, :3] = np.nan  # pixels without a valid date
    values[:20, 5, 5] = np.nan  # a pixel valid only in the second period
    periods = (tuple(range(20)), tuple(range(20, 37)))
    for groups in ((), periods):
        program = kernels.Program(assets=("x",), mask=None, masked_assets=(), bands=(), dtype="float32",
                                  reduce_method=method, groups=groups)
        with dask.config.set(scheduler="synchronous"):
            tree = tree_path._tree_reduce(da.from_array(values, chunks=(5, 32, 32)), program, "x").compute()
        assert tree.shape == (len(groups) or 1, 1, 1, 70, 65) and tree.dtype == np.float32
        for g, dates in enumerate(groups or (tuple(range(37)),)):
            fused = kernels.reduce_time(values[list(dates)], method)[0]  # the time-whole path
            assert np.array_equal(np.isnan(tree[g, 0, 0]), np.isnan(fused)), (method, g)
            np.testing.assert_allclose(tree[g, 0, 0], fused, rtol=2e-5, atol=1e-6)


# --- validate's assumptions -----------------------------------------------------------------------------------------


SPEC = textwrap.dedent(
    """\
    version: 1
    name: paths-case
    source:
      stac:
        catalog: items.json
        collections: [c]
        bbox: [13.0, 52.3, 13.8, 52.7]
        datetime: 2024-06-01/2024-08-31
        max_items: 24
      assets: {red: red, nir: nir, scl: scl}
    grid: {crs: "EPSG:32633", resolution: 10, bounds: [0, 0, 40960, 40960], dtype: float32}
    chunks: {time: -1, y: 2048, x: 2048}
    mask: "scl in (3, 8, 9, 10)"
    bands:
      ndvi: "(nir - red) / (nir + red)"
    reduce: {method: median}
    output: {path: out/x.zarr}
    cluster: {n_workers: 1, threads_per_worker: 2, memory_limit: 6GB, gdal_cachemax: 64MB}
    """
)


def test_validate_states_its_assumptions(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SPEC)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "assumes assets loaded as float32 (the items' data types are not read)" in result.output
    assert "24 items on the time axis, from source.stac.max_items" in result.output


def test_validate_does_not_refuse_what_narrower_loads_fit_and_says_why(tmp_path):
    # the date series of 4096² chunks, one date a task: one item's 3 assets as float32 are 201 MB per task more than
    # as uint8, × 2 threads: 1.71 GB > 0.5 × 3.1 GB; as uint16/uint8 (what Sentinel-2 items declare) it fits (1.40
    # GB): validate must not refuse what plan accepts
    series = (SPEC.replace("reduce: {method: median}\n", "").replace("y: 2048, x: 2048", "y: 4096, x: 4096")
              .replace("chunks: {time: -1", "chunks: {time: 1"))
    path = tmp_path / "s.yaml"
    path.write_text(series.replace("memory_limit: 6GB", "memory_limit: 3.1GB"))
    loaded = load_spec_text(path.read_text(), path=path)
    conservative = budget.estimate(budget.pipeline_shape(loaded.spec), make_plan(loaded.spec).report.inputs)
    assert not conservative.ok  # over budget with float loads
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "over budget if the assets load as float32" in result.output
    assert "`rasterflow plan` reads the items' data types and decides" in result.output
    # and a spec over budget even with uint8 loads is refused (exit 3) naming the assumption
    path.write_text(series.replace("memory_limit: 6GB", "memory_limit: 2GB"))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 3, result.output
    assert "assumed: assets loaded as float32" in result.output


# --- fixes ------------------------------------------------------------------------------------------------------------


def _checked(spec: Spec) -> budget.BudgetReport:
    """What ``plan`` decides for items that load as float32 (the static plan's inputs, without its leniency)."""
    shape = budget.pipeline_shape(spec)
    inputs = dataclasses.replace(make_plan(spec).report.inputs, load_assumed=False)
    return budget.with_fixes(budget.estimate(shape, inputs), shape)


def _apply(spec: Spec, fix: budget.Fix) -> Spec:
    data = spec.model_dump(mode="json", exclude_unset=True)
    data.update(yaml.safe_load(budget.fix_text(spec, fix)))  # what a user pastes: whole sections
    return Spec.model_validate(data)


def test_fix_sections_are_complete_and_pin_the_checked_layout():
    spec = load_spec_text(SPEC.replace("memory_limit: 6GB", "memory_limit: 0.8GB")
                          .replace("max_items: 24", "max_items: 8")).spec
    report = _checked(spec)
    assert not report.ok
    thread_fix = next(f for f in report.fixes if "threads_per_worker" in f.description)
    pasted = yaml.safe_load(budget.fix_text(spec, thread_fix))
    # the whole cluster section: the spec's own gdal_cachemax and the checked n_workers / memory_limit stay
    assert pasted["cluster"] == {"n_workers": 1, "threads_per_worker": 1, "memory_limit": int(0.8 * GB),
                                 "gdal_cachemax": "64MB"}


@pytest.mark.parametrize("change", [
    {"memory_limit: 6GB": "memory_limit: 0.8GB", "max_items: 24": "max_items: 8"},
    {"memory_limit: 6GB": "memory_limit: 1.5GB", "gdal_cachemax: 64MB": "gdal_cachemax: 512MB",
     "y: 2048, x: 2048": "y: 256, x: 256"},
    {"memory_limit: 6GB": "memory_limit: 700MB", "max_items: 24": "max_items: 200",
     "y: 2048, x: 2048": "y: 256, x: 256", "threads_per_worker: 2": "threads_per_worker: 1"},
    {"chunks: {time: -1": "chunks: {time: 6", "memory_limit: 6GB": "memory_limit: 2GB"},
    {"dtype: float32": "dtype: float64", "memory_limit: 6GB": "memory_limit: 1.1GB"},
])
def test_every_fix_pasted_into_its_spec_passes_with_the_same_peak(change):
    text = SPEC
    for old, new in change.items():
        text = text.replace(old, new)
    spec = load_spec_text(text).spec
    report = _checked(spec)
    assert not report.ok
    assert report.fixes, report.refusals
    for fix in report.fixes:
        fixed = _checked(_apply(spec, fix))
        assert fixed.ok, (fix.description, fixed.refusals)
        assert fixed.peak_per_worker == fix.peak_per_worker


def test_the_solver_tries_the_gdal_cache_and_max_items():
    # 512 MB of GDAL cache on a 1.5 GB worker: a smaller cache is the fix
    spec = load_spec_text(SPEC.replace("memory_limit: 6GB", "memory_limit: 1.5GB")
                          .replace("gdal_cachemax: 64MB", "gdal_cachemax: 512MB")
                          .replace("y: 2048, x: 2048", "y: 256, x: 256")).spec
    fixes = _checked(spec).fixes
    assert any(f.patch.get("cluster", {}).get("gdal_cachemax") == "64MB" for f in fixes), fixes
    # 200 dates of 256² on a 700 MB worker: nothing but a shorter time axis fits
    spec = load_spec_text(SPEC.replace("memory_limit: 6GB", "memory_limit: 700MB")
                          .replace("max_items: 24", "max_items: 200")
                          .replace("threads_per_worker: 2", "threads_per_worker: 1")
                          .replace("y: 2048, x: 2048", "y: 256, x: 256")).spec
    fixes = _checked(spec).fixes
    items = [f for f in fixes if "max_items" in f.description]
    assert items, fixes
    n = items[0].patch["source"]["stac"]["max_items"]
    assert 1 <= n < 200
    assert not _checked(load_spec_text(SPEC.replace("memory_limit: 6GB", "memory_limit: 700MB")
                                        .replace("max_items: 24", f"max_items: {n + 1}")
                                        .replace("threads_per_worker: 2", "threads_per_worker: 1")
                                        .replace("y: 2048, x: 2048", "y: 256, x: 256")).spec).ok


def test_suggested_chunks_are_multiples_of_the_source_tiles():
    spec = load_spec_text(SPEC.replace("memory_limit: 6GB", "memory_limit: 2GB")).spec
    inputs = dataclasses.replace(_checked(spec).inputs, source_tile=(512, 512))
    fixes = budget.solve_fixes(budget.pipeline_shape(spec), inputs)
    chunk = next(f for f in fixes if "largest square" in f.description)
    assert chunk.patch["chunks"]["y"] % 512 == 0 and "512-px source tiles" in chunk.description


# --- real runs -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fix_runs_within_its_limit_on_a_local_cluster(sample, tmp_path):
    """A spec refused at an 800 MB worker; its first fix, pasted, runs on a real LocalCluster below max_fraction × limit."""
    from conftest import spec_text

    path = tmp_path / "s.yaml"
    minx, miny, maxx, maxy = sample.bounds
    text = spec_text(sample, reduce="{method: mean}", chunks="{time: -1, y: 1024, x: 1024}", output="out/r.zarr",
                     cluster="{n_workers: 1, threads_per_worker: 2, memory_limit: 800MB, gdal_cachemax: 256MB}")
    # 1.25 m pixels over the 256² sample: a 2048² output (4 chunks, 2 at once) read through the warp, as float64
    text = text.replace("resolution: 10", "resolution: 1.25").replace("crs: EPSG:32633", "crs: EPSG:32633\n  dtype: float64")
    path.write_text(text)
    result = CliRunner().invoke(cli, ["plan", str(path), "--fix"])
    assert result.exit_code == 3, result.output
    loaded = load_spec_text(text, path=path)
    from rasterflow.commands import plan_with_items, resolve_layout, search

    plan = plan_with_items(loaded, search(loaded), resolve_layout(loaded.spec))
    assert not plan.report.ok and plan.report.fixes
    fix = plan.report.fixes[0]
    assert budget.fix_text(loaded.spec, fix) in result.output
    data = yaml.safe_load(text)
    data.update(yaml.safe_load(budget.fix_text(loaded.spec, fix)))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(cli, ["run", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "r.zarr.report.json").read_text())
    allowed = 0.5 * report["memory_limit"]
    assert report["measured_peak_per_worker"]
    assert max(report["measured_peak_per_worker"].values()) <= allowed
    assert report["predicted_peak_per_worker"] <= allowed


@pytest.mark.slow
def test_a_failed_run_keeps_its_memory_samples(sample, tmp_path):
    from conftest import sample_with_truncated_file, spec_text

    catalog, _victim = sample_with_truncated_file(sample, tmp_path, 5)  # fails mid-computation
    path = tmp_path / "s.yaml"
    path.write_text(spec_text(sample, catalog=str(catalog), reduce="{method: median}",
                              output="out/fail.zarr", chunks="{time: -1, y: 64, x: 64}",
                              cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}"))
    result = CliRunner().invoke(cli, ["run", str(path)])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "out" / "fail.zarr.report.json").read_text())
    assert report["status"] == "failed"
    assert report["memory_samples"], "a failed run's report has no memory samples"
    assert report["measured_peak_per_worker"] and min(report["measured_peak_per_worker"].values()) > 50 * MB
    assert any(s["worker"] == "client" for s in report["memory_samples"])


def test_the_cog_client_of_worker_tiles_is_what_the_season_measured():
    """When the workers compress the tiles the season's COG client holds its baseline, the tiles in flight and the
    small overview levels: measured 375-386 MB in four runs of the 10980² x 36 season (2026-12-05)."""
    shape = _shape(fmt="cog")
    season = _inputs(grid_shape=(10980, 10980), n_time=36, n_workers=2, gdal_cachemax=16 * MB,
                     writer_cachemax=256 * MB, client_cores=2)
    assert budget.cog_tile_layout(shape, season) is not None
    predicted = budget.client_peak_bytes(shape, season)
    assert 386 * MB <= predicted <= 1.3 * 375 * MB


def test_the_cog_client_counts_the_copy_that_follows_the_blocks(monkeypatch):
    """With GDAL's COG driver (other layouts; here forced with RASTERFLOW_COG_WRITER=gdal), after the last block
    the client copies each file into a COG with overviews; GDAL holds ~COG_COPY_ROWS rows
    of the file's width besides its cache (more per copy thread). The 10980² x 36 season's COG client measured
    757 MB with 2 copy threads and a 256 MB writer cache (benchmarks/README.md, 2026-12-04): the model must not be
    below it, nor far above; the same job at 2048² stays as before (blocks in flight outweigh a narrow copy)."""
    monkeypatch.setenv("RASTERFLOW_COG_WRITER", "gdal")
    shape = _shape(fmt="cog")
    season = _inputs(grid_shape=(10980, 10980), n_time=36, n_workers=2, gdal_cachemax=16 * MB,
                     writer_cachemax=256 * MB, client_cores=2)
    predicted = budget.client_peak_bytes(shape, season)
    assert 757 * MB <= predicted <= 1.3 * 757 * MB
    row = 10980 * 4
    assert budget.cog_copy_bytes(shape, season) == row * (budget.COG_COPY_ROWS + budget.COG_COPY_ROWS_PER_THREAD)
    assert budget.cog_copy_bytes(shape, dataclasses.replace(season, client_cores=1)) == row * budget.COG_COPY_ROWS
    # a tiled output copies one tile at a time: the tile's width counts, not the grid's
    tiled = dataclasses.replace(shape, tile_size=2048)
    assert budget.cog_copy_bytes(tiled, season) == 2048 * 4 * (budget.COG_COPY_ROWS + budget.COG_COPY_ROWS_PER_THREAD)


def test_held_blocks_are_those_of_the_tasks_after_the_running_ones():
    """Series path, two threads: while the two largest tasks run, the blocks held are two other tasks'. On a grid of
    equal chunks that is two full blocks; on a 1400² grid of 1024² chunks (1024², 1024 x 376 twice, 376²) the
    blocks of the third and fourth task (budget_accuracy.py row 25 was predicted 1.60x its measured peak when the
    largest block was counted for both threads)."""
    dates = 16
    two = _shape(None, bands=2)  # two bands: a block waits for its second write (one band holds none)
    equal = budget.held_between_tasks(two, _inputs(threads_per_worker=2))
    assert equal == 2 * 2 * dates * ONE
    uneven = budget.held_between_tasks(two, _inputs(threads_per_worker=2, grid_shape=(1400, 1400)))
    assert uneven == 2 * dates * 4 * (376 * 1024 + 376 * 376)
    one_thread = budget.held_between_tasks(two, _inputs(grid_shape=(1400, 1400)))
    assert one_thread == 2 * dates * 4 * 376 * 1024  # the second largest task's block, while the largest runs
    # fewer tasks than threads x 2: only the tasks that exist can be held
    single = budget.held_between_tasks(two, _inputs(threads_per_worker=2, grid_shape=(1024, 1024)))
    assert single == 0
    assert budget.held_between_tasks(_shape(None), _inputs(threads_per_worker=2)) == 0


def test_remote_reads_hold_a_row_of_the_chunks_tiles_per_file():
    """Over remote files the fused task takes its sub-blocks across each row of them and the reader holds a row
    of the chunk's compressed tiles per file until the row is done: source.io.buffer plus files x (tiles down a
    sub-block) x (tiles across the chunk) x the compressed bytes of a tile. Local reads hold nothing of the kind and
    keep the order down each column (GDAL's block cache)."""
    shape = _shape("median")
    local = _inputs(n_time=36, source_tile=(512, 512), threads_per_worker=2, one_process=True)
    remote = dataclasses.replace(local, remote_fetch=True, io_buffer=8_000_000, source_bytes_per_pixel=0.75)
    assert budget.sub_block(shape, remote) == (512, 512)  # one source tile of a 1024² chunk: 2 x 2 tiles
    assert not budget.sub_blocks_across(local) and budget.sub_blocks_across(remote)
    assert budget.remote_io_bytes(shape, local) == 0
    files = remote.files_per_chunk or remote.n_time * len(shape.assets_loaded)
    assert budget.remote_io_bytes(shape, remote) == 8_000_000 + int(files * 1 * 2 * 512 * 512 * 0.75)
    # strips of a deep series: a strip is within one row of tiles, the row is still held across the chunk
    deep = dataclasses.replace(remote, n_time=365)
    rows, cols = budget.sub_block(shape, deep)
    assert rows < 512 and cols == 512
    deep_files = deep.files_per_chunk or deep.n_time * len(shape.assets_loaded)
    assert budget.remote_io_bytes(shape, deep) == 8_000_000 + int(deep_files * 2 * 512 * 512 * 0.75)


def test_reads_started_ahead_are_counted_once_more_per_running_task():
    """Each running task's successor has its remote reads started before it runs, within source.io.buffer: in the
    one-process layout (``read.prefetch.ahead`` from the writer), and with worker processes where the writer sends a
    chunk's work as one task to a worker it picks (the fused path to Zarr without shards, and to COG), or a chunk's
    band tasks with all their chunk's tasks (the time-chunked tree path, where the writer's cap lets every worker
    have a chunk), and the series' band tasks each as one task with their writes (to Zarr). The worker's
    remote-read term counts a buffer more per running task there; not for a sharded
    Zarr or a tree whose chunks do not fit the cap so; nothing locally."""
    from rasterflow.budget.constants import REMOTE_CLIENT_BYTES

    shape = _shape("median")
    one = _inputs(n_time=36, source_tile=(512, 512), threads_per_worker=2, one_process=True, remote_fetch=True,
                  io_buffer=8_000_000, source_bytes_per_pixel=0.75)
    per_task = budget.remote_io_bytes(shape, one)
    assert budget.started_ahead(shape, one)
    assert budget.remote_io_total(shape, one, 2) == 2 * (per_task + 8_000_000) + REMOTE_CLIENT_BYTES
    workers = dataclasses.replace(one, one_process=False)
    assert budget.started_ahead(shape, workers)
    assert budget.remote_io_total(shape, workers, 2) == 2 * (budget.remote_io_bytes(shape, workers) + 8_000_000) \
        + REMOTE_CLIENT_BYTES
    cog = _shape("median", fmt="cog")
    assert budget.started_ahead(cog, workers)
    assert budget.remote_io_total(cog, workers, 2) == 2 * (budget.remote_io_bytes(cog, workers) + 8_000_000) \
        + REMOTE_CLIENT_BYTES
    tree = dataclasses.replace(workers, chunk_time=6)
    assert budget.code_path(shape, tree) == "tree"
    assert budget.started_ahead(shape, tree)
    assert budget.remote_io_total(shape, tree, 2) == 2 * (budget.remote_io_bytes(shape, tree) + 8_000_000) \
        + REMOTE_CLIENT_BYTES
    # a COG from the tree path: its chunk's one file is one batch, and one chunk per worker fits the cap
    assert budget.started_ahead(cog, tree)
    # to Zarr a chunk per thread is in flight however many blocks it holds (6 and 24 periods on 2 workers x 1
    # thread: 2 x 6 and 24 > 8), each placed on its worker with its reads started
    monthly = _shape("mean", period=True)
    two = dataclasses.replace(tree, n_workers=2, threads_per_worker=1)
    assert budget.started_ahead(monthly, dataclasses.replace(two, n_periods=4))  # 2 x 4 blocks <= 8
    assert budget.started_ahead(monthly, dataclasses.replace(two, n_periods=6))
    assert budget.started_ahead(monthly, dataclasses.replace(two, n_periods=24))
    monthly_cog = _shape("mean", period=True, fmt="cog")  # a file per month: 2 x 6 over the COG writer's cap
    assert budget.started_ahead(monthly_cog, dataclasses.replace(two, n_periods=1))
    assert not budget.started_ahead(monthly_cog, dataclasses.replace(two, n_periods=6))
    assert budget.remote_io_total(monthly_cog, dataclasses.replace(two, n_periods=6), 2) == \
        2 * budget.remote_io_bytes(monthly_cog, dataclasses.replace(two, n_periods=6)) + REMOTE_CLIENT_BYTES
    # the series to Zarr: each band task with its dates' writes is one task the writer places, however many dates
    # (12 blocks each here, over the cap of 8); not to COG (a file per date), nor locally
    series = _shape(None)
    by_twelve = dataclasses.replace(two, chunk_time=12)
    assert budget.code_path(series, by_twelve) == "series" and budget.started_ahead(series, by_twelve)
    assert budget.remote_io_total(series, by_twelve, 1) == budget.remote_io_bytes(series, by_twelve) + 8_000_000 \
        + REMOTE_CLIENT_BYTES
    assert not budget.started_ahead(_shape(None, fmt="cog"), by_twelve)
    assert not budget.started_ahead(series, dataclasses.replace(by_twelve, remote_fetch=False))
    sharded = budget.PipelineShape(**{**dataclasses.asdict(shape), "zarr_format": 3})
    big = dataclasses.replace(workers, grid_shape=(20480, 20480), chunk_y=512, chunk_x=512)
    assert budget.shards_per_side(sharded, big) > 1 and not budget.started_ahead(sharded, big)
    assert not budget.started_ahead(sharded, dataclasses.replace(big, chunk_time=6))
    local = dataclasses.replace(one, remote_fetch=False)
    assert not budget.started_ahead(shape, local) and budget.remote_io_total(shape, local, 2) == 0


def test_the_auto_buffer_follows_the_round_trip_plan_measured():
    """source.io.buffer: auto is 32 MiB per 100 ms of measured round trip, within 16..64 MiB, 32 MiB unmeasured;
    a number is taken as it is. The plan's read policy and its budget take the same value."""
    from rasterflow.readplan import io_buffer, policy_from_spec
    from rasterflow.spec.source import SourceIO

    mib = 1024 * 1024
    assert [io_buffer(None, rtt) for rtt in (None, 0.0, 0.01, 0.04, 0.1, 0.15, 1.0)] == \
        [32 * mib, 32 * mib, 16 * mib, 16 * mib, 32 * mib, 48 * mib, 64 * mib]
    assert io_buffer(8 * mib, 0.1) == 8 * mib
    auto = types.SimpleNamespace(io=SourceIO())
    assert policy_from_spec(auto, round_trip=0.04).io_buffer == 16 * mib
    assert policy_from_spec(auto).io_buffer == 32 * mib
    fixed = types.SimpleNamespace(io=SourceIO(buffer="8MB"))
    assert policy_from_spec(fixed, round_trip=0.04).io_buffer == SourceIO(buffer="8MB").buffer_bytes
