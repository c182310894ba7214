"""Bounded submission (issue 13, step 4): the writers keep a capped number of blocks in flight on a real cluster.

A real LocalCluster of 2 worker processes; the scheduler's task count is watched by a scheduler plugin (public
``SchedulerPlugin`` API, read back with ``Client.run_on_scheduler``) at every transition, the client's futures in
the writers' progress callback. Values are compared with a NumPy reference.
"""

from __future__ import annotations

import os
import time

import dask.array as da
import numpy as np
import pytest
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine
from dask.highlevelgraph import HighLevelGraph

from rasterflow.errors import RunFailedError
from rasterflow.write import write_cog, write_zarr
from rasterflow.write.submit import BlockTasks, in_flight_cap, run_units

distributed = pytest.importorskip("distributed")

CRS = "EPSG:32633"
TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)
CHUNK = 32
SHAPE = (8 * CHUNK, 8 * CHUNK)  # 64 blocks
NBLOCKS = 64
PLUGIN = "rasterflow-test-peak-tasks"


class PeakTasks(distributed.diagnostics.plugin.SchedulerPlugin):
    """Records the most tasks the scheduler held at once (checked at every task transition)."""

    name = PLUGIN

    def __init__(self) -> None:
        self.peak = 0
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        self.peak = max(self.peak, len(self.scheduler.tasks))


def _peak(dask_scheduler=None) -> int:
    return dask_scheduler.plugins[PLUGIN].peak


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def peak(client):
    """A fresh plugin for one test; call the returned function for the peak so far."""
    client.register_plugin(PeakTasks(), name=PLUGIN)
    yield lambda: client.run_on_scheduler(_peak)
    client.unregister_scheduler_plugin(PLUGIN)


def _reference() -> np.ndarray:
    rows, cols = np.indices(SHAPE)
    values = (np.sin(rows / 7.0) * np.cos(cols / 5.0)).astype(np.float32)
    values[(rows * 31 + cols * 17) % 13 == 0] = np.nan
    return values


def _chunk_values(calls_dir: str, location: tuple[int, int], fail_flag: str | None,
                  fail_block: tuple[int, int] | None) -> np.ndarray:
    with open(os.path.join(calls_dir, "%d.%d.%d" % (*location, os.getpid())), "w"):
        pass
    if fail_block is not None and location == fail_block and fail_flag and os.path.exists(fail_flag):
        raise RuntimeError(f"injected failure in block {location}")
    (i, j) = location
    rows, cols = np.mgrid[i * CHUNK:(i + 1) * CHUNK, j * CHUNK:(j + 1) * CHUNK]
    values = (np.sin(rows / 7.0) * np.cos(cols / 5.0)).astype(np.float32)
    values[(rows * 31 + cols * 17) % 13 == 0] = np.nan
    return values


class _SourceTasks:
    def __init__(self, calls_dir, fail_flag, fail_block):
        self.args = (calls_dir, fail_flag, fail_block)

    def __call__(self, block):
        return (_chunk_values, self.args[0], tuple(block), *self.args[1:])


def _twice(block: np.ndarray) -> np.ndarray:
    return block * 2


class _TwiceTasks:
    def __init__(self, source: str):
        self.source = source

    def __call__(self, block):
        return (_twice, (self.source, *block))


def _source(calls_dir: str, fail_flag: str | None = None, fail_block: tuple[int, int] | None = None) -> da.Array:
    """A lazy band made of rasterflow's own layers (as ``graph.build_dataset``'s), computed block by block on the
    workers; each block leaves a file in ``calls_dir`` (a worker-side counter), and ``fail_block`` raises while
    ``fail_flag`` exists."""
    from dask.base import tokenize

    from rasterflow.layers import lazy_array

    name = "test-source-" + tokenize(calls_dir, fail_flag, fail_block)
    return lazy_array(name, (8, 8), _SourceTasks(calls_dir, fail_flag, fail_block), ((CHUNK,) * 8, (CHUNK,) * 8),
                      np.float32)


def _double(band: da.Array) -> da.Array:
    from rasterflow.layers import lazy_array

    return lazy_array(band.name + "-twice", band.numblocks, _TwiceTasks(band.name), band.chunks, band.dtype, [band])


def _plain_source(calls_dir: str) -> da.Array:
    """The same band as a plain Dask array (``map_blocks``): what a writer's caller may pass that is not ours."""

    def chunk(block_info=None):
        return _chunk_values(calls_dir, tuple(block_info[None]["chunk-location"]), None, None)

    return da.map_blocks(chunk, chunks=((CHUNK,) * 8, (CHUNK,) * 8), dtype=np.float32,
                         meta=np.empty((0, 0), dtype=np.float32))


def _dataset(band: da.Array) -> xr.Dataset:
    height, width = SHAPE
    coords = {"y": TRANSFORM.f + TRANSFORM.e * (np.arange(height) + 0.5),
              "x": TRANSFORM.c + TRANSFORM.a * (np.arange(width) + 0.5)}
    from rasterflow.layers import layer_named

    water = _double(band) if layer_named(band.name) is not None else band * 2
    ds = xr.Dataset({"ndvi": (("y", "x"), band), "water": (("y", "x"), water)}, coords=coords)
    return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM)


def _calls(calls_dir) -> list[tuple[int, int]]:
    return [tuple(int(p) for p in name.split(".")[:2]) for name in os.listdir(calls_dir)]


def _assert_written_once(result, path: str, calls) -> None:
    """Every block of both variables written, the values NumPy's, every source block computed once."""
    assert result.blocks_written == 2 * NBLOCKS and result.blocks_skipped == 0
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, _reference())
    np.testing.assert_array_equal(out["water"].values, _reference() * 2)
    assert sorted(_calls(calls)) == sorted(np.ndindex(8, 8))


def test_zarr_keeps_the_scheduler_and_the_client_to_the_cap(tmp_path, client, peak):
    calls = tmp_path / "calls"
    calls.mkdir()
    futures_seen: list[int] = []
    progress: list[tuple[int, int]] = []

    def on_progress(done: int, total: int) -> None:
        progress.append((done, total))
        futures_seen.append(len(client.futures))

    cap = in_flight_cap(client)
    assert cap == 8  # 4 per worker thread, 2 threads
    path = str(tmp_path / "out.zarr")
    result = write_zarr(_dataset(_source(str(calls))), path, fingerprint="fp", client=client, progress=on_progress)

    # every source block computed once (both variables of a block go together, so it is shared)
    _assert_written_once(result, path, calls)
    assert progress[-1] == (2 * NBLOCKS, 2 * NBLOCKS) and len(progress) == 2 * NBLOCKS
    # a block is 2 tasks (the source shared by both variables, 'water = 2 ndvi' and a write per variable: 4 per
    # position); the scheduler holds those of the blocks in flight (<= cap) and of blocks just released that it has
    # not yet forgotten (<= cap): at most 2 x 2 x cap, against all 4 x 64 of an unbounded submission
    held = peak()
    print(f"cap {cap} blocks; scheduler peak {held} tasks; client futures at most {max(futures_seen)}; "
          f"the whole job is {4 * NBLOCKS} tasks")
    assert 0 < held <= 2 * 2 * cap <= 4 * NBLOCKS // 8
    assert max(futures_seen) <= cap


def _series_chunk(calls_dir: str, location: tuple[int, int, int], dates: int) -> np.ndarray:
    """A band task of a series: ``dates`` dates of one spatial chunk, its run's start and end left in ``calls_dir``."""
    started = time.time()
    time.sleep(0.3)  # long enough that two tasks running at once overlap on any machine
    k, i, j = location
    values = np.stack([_chunk_values(calls_dir, (i, j), None, None) + (k * dates + d) for d in range(dates)])
    with open(os.path.join(calls_dir, f"series_{k}_{i}_{j}_{started}_{time.time()}"), "w"):
        pass
    return values


class _SeriesTasks:
    def __init__(self, calls_dir: str, dates: int):
        self.calls_dir, self.dates = calls_dir, dates

    def __call__(self, block):
        return (_series_chunk, self.calls_dir, tuple(block), self.dates)


@pytest.mark.parametrize("grouped", [True, False])
def test_a_series_band_task_with_its_dates_writes_is_one_unit(tmp_path, client, grouped):
    """A series (3 band tasks of 4 dates per chunk, each date a Zarr chunk: 12 blocks a chunk, over the cap of 8):
    with ``lead_groups`` each band task's dates are one unit, one task with their writes, and threads + 1 units are
    in flight, so band tasks of different chunks run at once on the two workers; without it a chunk is one unit of
    12 blocks, alone in flight: one chunk at a time, its third band task with a worker idle. The values and one run
    per band task either way."""
    from dask.base import tokenize

    from rasterflow.graph import select_blocks
    from rasterflow.layers import lazy_array

    calls = tmp_path / "calls"
    calls.mkdir()
    dates, groups, side = 4, 3, 2
    source = lazy_array("test-series-" + tokenize(str(calls)), (groups, side, side), _SeriesTasks(str(calls), dates),
                        ((dates,) * groups, (CHUNK,) * side, (CHUNK,) * side), np.float32)
    leads = {(t,): ((t // dates,), slice(t % dates, t % dates + 1)) for t in range(groups * dates)}
    band = select_blocks(source, "ndvi", leads, ((1,) * (groups * dates),))
    coords = {"time": np.arange(groups * dates), "y": TRANSFORM.f + TRANSFORM.e * (np.arange(side * CHUNK) + 0.5),
              "x": TRANSFORM.c + TRANSFORM.a * (np.arange(side * CHUNK) + 0.5)}
    ds = xr.Dataset({"ndvi": (("time", "y", "x"), band)}, coords=coords).rio.write_crs(CRS).rio.write_transform(
        TRANSFORM)
    path = str(tmp_path / "series.zarr")
    result = write_zarr(ds, path, fingerprint="fp", client=client, lead_groups=(dates,) * groups if grouped else None)

    assert result.blocks_written == groups * dates * side * side
    expected = np.stack([_reference()[:side * CHUNK, :side * CHUNK] + t for t in range(groups * dates)])
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, expected)
    runs = [name.split("_")[1:] for name in os.listdir(calls) if name.startswith("series_")]
    assert sorted((int(k), int(i), int(j)) for k, i, j, _, _ in runs) == sorted(np.ndindex(groups, side, side))
    spans = [((i, j), float(start), float(end)) for _, i, j, start, end in runs]
    overlapping_chunks = any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in spans for b in spans)
    assert overlapping_chunks == grouped


@pytest.mark.parametrize("tree", [True, False])
def test_a_tree_chunk_over_the_cap_runs_beside_another(tmp_path, client, tree):
    """A tree chunk whose periods fill the cap (one upstream task per chunk, 12 period blocks: over the cap of 8):
    with ``place_reads`` (the tree path) a chunk per worker thread is in flight, so two chunks' tasks run at once on
    the two workers; without it a chunk goes alone, one at a time. The values and one run per chunk either way."""
    from dask.base import tokenize

    from rasterflow.graph import select_blocks
    from rasterflow.layers import lazy_array

    calls = tmp_path / "calls"
    calls.mkdir()
    periods, side = 12, 2
    source = lazy_array("test-tree-" + tokenize(str(calls)), (1, side, side), _SeriesTasks(str(calls), periods),
                        ((periods,), (CHUNK,) * side, (CHUNK,) * side), np.float32)
    leads = {(t,): ((0,), slice(t, t + 1)) for t in range(periods)}
    band = select_blocks(source, "ndvi", leads, ((1,) * periods,))
    coords = {"period": np.arange(periods), "y": TRANSFORM.f + TRANSFORM.e * (np.arange(side * CHUNK) + 0.5),
              "x": TRANSFORM.c + TRANSFORM.a * (np.arange(side * CHUNK) + 0.5)}
    ds = xr.Dataset({"ndvi": (("period", "y", "x"), band)}, coords=coords).rio.write_crs(CRS).rio.write_transform(
        TRANSFORM)
    path = str(tmp_path / "tree.zarr")
    result = write_zarr(ds, path, fingerprint="fp", client=client, place_reads=tree)

    assert result.blocks_written == periods * side * side
    expected = np.stack([_reference()[:side * CHUNK, :side * CHUNK] + t for t in range(periods)])
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, expected)
    runs = [name.split("_")[1:] for name in os.listdir(calls) if name.startswith("series_")]
    assert sorted((int(k), int(i), int(j)) for k, i, j, _, _ in runs) == sorted(np.ndindex(1, side, side))
    spans = [((i, j), float(start), float(end)) for _, i, j, start, end in runs]
    overlapping_chunks = any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in spans for b in spans)
    assert overlapping_chunks == tree


def test_the_fused_path_writes_a_chunk_and_its_variables_in_one_task(tmp_path, client, peak):
    """``fused=True`` (the fused path's chunks): a chunk's shared task and the writes of both its variables are one
    task on one worker, so its result never waits on a worker for write tasks; the values, the resume markers and
    the bound are those of the task-per-key submission."""
    calls = tmp_path / "calls"
    calls.mkdir()
    path = str(tmp_path / "fused.zarr")
    result = write_zarr(_dataset(_source(str(calls))), path, fingerprint="fp", client=client, fused=True)

    _assert_written_once(result, path, calls)
    # one task per chunk in flight: threads + QUEUED_UNITS = 3 at once at least, never the 4 tasks per chunk
    held = peak()
    assert 0 < held <= 2 * 4
    # both variables' statistics came back through the unit's task
    assert set(result.statistics) == {"ndvi", "water"} and len(result.statistics["water"]) == NBLOCKS
    water = list(result.statistics["water"].values())
    assert sum(s.count for s in water) == int(np.count_nonzero(~np.isnan(_reference())))
    np.testing.assert_allclose(max(s.max for s in water), np.nanmax(_reference() * 2), rtol=1e-6)


def test_a_plain_dask_dataset_is_written_with_its_shared_blocks_computed_once(tmp_path, client):
    """Not rasterflow's own layers: the blocks are computed through Dask's collection API, a batch's in one
    ``compute`` (so the block both variables share runs once), still bounded."""
    calls = tmp_path / "calls"
    calls.mkdir()
    path = str(tmp_path / "plain.zarr")
    result = write_zarr(_dataset(_plain_source(str(calls))), path, fingerprint="fp", client=client)
    assert result.blocks_written == 2 * NBLOCKS
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, _reference())
    np.testing.assert_array_equal(out["water"].values, _reference() * 2)
    assert sorted(_calls(calls)) == sorted(np.ndindex(8, 8))


def test_cog_keeps_the_scheduler_to_the_cap(tmp_path, client, peak):
    calls = tmp_path / "calls"
    calls.mkdir()
    result = write_cog(_dataset(_source(str(calls))), str(tmp_path / "out.tif"), client=client)
    assert result.blocks_written == NBLOCKS
    import rasterio

    with rasterio.open(result.paths[0]) as src:
        np.testing.assert_array_equal(src.read(1), _reference())
        np.testing.assert_array_equal(src.read(2), _reference() * 2)
    cap = in_flight_cap(client, 2)
    held = peak()
    print(f"COG: cap {cap} blocks, scheduler peak {held} tasks")
    # a COG block is 5 tasks (the source, 'water = 2 ndvi', each band's slice of the stack, the rechunk merging
    # them), for blocks in flight and just released (2 x cap), against 5 x 64 for the whole job
    assert 0 < held <= 5 * 2 * cap <= 5 * NBLOCKS // 8


def test_a_failing_block_cancels_the_rest_and_the_rerun_resumes(tmp_path, client):
    calls = tmp_path / "calls"
    calls.mkdir()
    flag = tmp_path / "fail"
    flag.touch()
    fail_block = (4, 3)  # the 36th of 64 blocks in submission order
    path = str(tmp_path / "out.zarr")
    ds = _dataset(_source(str(calls), str(flag), fail_block))
    with pytest.raises(RunFailedError, match="injected failure") as err:
        write_zarr(ds, path, fingerprint="job", client=client)
    assert "resume" in str(err.value)
    # a task already running when the rest was cancelled still finishes (Dask cannot stop a running thread) and
    # leaves its marker: wait until the workers are idle before counting the finished blocks
    import time

    def markers() -> dict[str, set[tuple[int, ...]]]:
        root = os.path.join(path + ".partial", ".rasterflow", "done")
        return {name: {tuple(int(i) for i in m.split(".")) for m in os.listdir(os.path.join(root, name))}
                for name in ("ndvi", "water")}

    deadline = time.monotonic() + 30
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    done = markers()
    while time.monotonic() < deadline:  # and until no marker appears for a second
        time.sleep(1.0)
        if markers() == done:
            break
        done = markers()
    order = list(np.ndindex(8, 8))
    position = order.index(fail_block)
    started = set(_calls(calls))
    finished = done["ndvi"] & done["water"]
    assert fail_block not in done["ndvi"] | done["water"]
    # the rest was cancelled: besides the finished blocks, only those in flight with the failing one (at most one
    # cap: 8 blocks = 4 positions of 2 variables) were ever started, and nothing was submitted after it
    cap_units = in_flight_cap(client) // 2
    assert fail_block in started and len(started - finished) <= cap_units
    assert len(started) < NBLOCKS
    assert len(finished) >= position - cap_units  # the blocks before it are kept (bar those in flight with it)

    for name in os.listdir(calls):
        os.remove(calls / name)
    flag.unlink()
    result = write_zarr(_dataset(_source(str(calls))), path, fingerprint="job", client=client)
    n_done = len(done["ndvi"]) + len(done["water"])
    assert result.blocks_skipped == n_done and result.blocks_written == 2 * NBLOCKS - n_done
    # only the unfinished blocks were computed again
    assert set(_calls(calls)) == set(order) - finished
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, _reference())
    np.testing.assert_array_equal(out["water"].values, _reference() * 2)


def test_a_batch_has_only_the_batch_tasks_and_makes_no_other():
    from rasterflow.layers import lazy_array

    side = 200  # 40,000 blocks
    made: list = []

    def make(block):
        made.append(block)
        return (np.full, (1, 1), block[0] * 1000 + block[1], np.int32)

    source = lazy_array("test-source-40k", (side, side), make, ((1,) * side, (1,) * side), np.int32)
    keys = [(source.name, 17, 3), (source.name, 199, 199)]
    batch = BlockTasks([source])(keys)
    assert sorted(made) == [(17, 3), (199, 199)]  # no other task of the 40,000 was made
    assert [v.tolist() for v in batch.compute()] == [[[17003]], [[199199]]]
    # a collection that is not ours: its blocks through Dask's public API, what they share computed once
    band = da.ones((side * 4, side * 4), chunks=4, dtype=np.float32)
    out = (band * 2 + 1).map_blocks(lambda b: b[:1, :1].astype(np.int8), chunks=((1,) * side, (1,) * side),
                                    dtype=np.int8)
    values = BlockTasks([out])([(out.name, 17, 3), (out.name, 199, 199)]).compute()
    assert [v.tolist() for v in values] == [[[3]], [[3]]]


def test_the_local_path_is_bounded_too():
    """No distributed client: a pool of threads, at most ``max_in_flight`` keys submitted and not yet finished."""
    import dask

    band = da.arange(64 * 4, chunks=4)
    blocks = band.map_blocks(lambda b: np.atleast_1d(b.sum()), chunks=((1,) * 64,), dtype=band.dtype)
    graph = BlockTasks([blocks])
    state = {"submitted": 0, "finished": 0, "most": 0}

    def build(keys):
        state["submitted"] += len(keys)
        state["most"] = max(state["most"], state["submitted"] - state["finished"])
        return graph(keys)

    def on_result(key, value):
        state["finished"] += 1
        results[key[1]] = int(value[0])

    results: dict = {}
    with dask.config.set(scheduler="threads", num_workers=3):
        written = run_units(([(blocks.name, i)] for i in range(64)), build, total=64, max_in_flight=4,
                            on_result=on_result)
    assert written == 64
    assert [results[i] for i in range(64)] == [int(np.arange(4 * i, 4 * i + 4).sum()) for i in range(64)]
    assert state["most"] <= 4


# ---- layers made on demand (issue 13, step 4: the graph built lazily per batch) -----------------------------------


def test_task_layer_is_a_mapping_of_tasks_made_when_asked():
    from rasterflow.layers import TaskLayer

    made = []

    def make(block):
        made.append(block)
        return (np.full, (2, 2), 10 * block[0] + block[1])

    layer = TaskLayer("t", (3, 4), make)
    assert len(layer) == 12 and list(layer)[:5] == [("t", 0, 0), ("t", 0, 1), ("t", 0, 2), ("t", 0, 3), ("t", 1, 0)]
    assert ("t", 2, 3) in layer and ("t", np.int64(2), 3) in layer and not made
    for outside in [("t", 3, 0), ("t", 0, -1), ("t", 0), ("u", 0, 0), ("t", 0.0, 0), ("t", True, 0), (0, 0), "t"]:
        assert outside not in layer
    band = da.Array(HighLevelGraph.from_collections("t", layer, dependencies=()), "t", ((2,) * 3, (2,) * 4),
                    meta=np.empty((0, 0), dtype=float))
    batch = BlockTasks([band])([("t", 1, 2)])
    assert made == [(1, 2)]
    np.testing.assert_array_equal(batch.compute()[0], np.full((2, 2), 12))
    np.testing.assert_array_equal(band.compute(scheduler="synchronous"),
                                  np.kron(10 * np.arange(3)[:, None] + np.arange(4), np.ones((2, 2))))


def _stack_reference(arrays, nlead, dtype):
    """The COG writer's cube as Dask builds it: stack, cast, rechunk to 1 along the leading dims."""
    cube = da.stack([a.astype(dtype, copy=False) for a in arrays], axis=nlead)
    return cube.rechunk({**{axis: 1 for axis in range(nlead)}, nlead: len(arrays)})


@pytest.mark.parametrize("nlead", [0, 1, 2])
def test_stack_blocks_is_dasks_stack_and_rechunk(nlead):
    from rasterflow.layers import stack_blocks

    rng = np.random.default_rng(7)
    shape = (3, 2)[:nlead] + (50, 70)
    values = [rng.normal(size=shape).astype(np.float32), rng.integers(-5, 5, size=shape).astype(np.int16),
              rng.normal(size=shape)]
    values[0][..., 3, 4] = np.nan
    # leading chunks of 2 and 1 (the cube's blocks cut into them), spatial chunks with a remainder
    arrays = [da.from_array(v, chunks=((2, 1), (1, 1))[:nlead] + (16, 32)) for v in values[:2]]
    arrays.append(da.from_array(values[2], chunks=((1, 2), (2,))[:nlead] + (16, 32)))
    dtype = np.result_type(*(a.dtype for a in arrays))
    cube = stack_blocks(arrays, nlead, dtype)
    expected = _stack_reference(arrays, nlead, dtype)
    assert cube.chunks == expected.chunks and cube.dtype == expected.dtype == np.float64
    np.testing.assert_array_equal(cube.compute(scheduler="synchronous"), expected.compute(scheduler="synchronous"))
    np.testing.assert_array_equal(cube.compute(scheduler="synchronous"), np.stack(values, axis=nlead).astype(dtype))
    # a block through BlockTasks, as the COG writer asks for it
    key = (cube.name, *(0,) * nlead, 0, 3, 2)
    block = dask_get(BlockTasks([cube])([key]), key)
    np.testing.assert_array_equal(block, expected.blocks[(0,) * nlead + (0, 3, 2)].compute())
    with pytest.raises(ValueError, match="same y and x chunks"):
        stack_blocks([arrays[0], arrays[1].rechunk({nlead: 25})], nlead, dtype)


def dask_get(batch, key):
    return batch.compute()[0]


def test_stack_blocks_holds_nothing_per_block():
    import tracemalloc

    from rasterflow.layers import stack_blocks

    side = 100  # 10,000 blocks per array
    arrays = [da.ones((side * 4, side * 4), chunks=4, dtype=np.float32) * k for k in (1, 2, 3)]
    tracemalloc.start()
    cube = stack_blocks(arrays, 0, np.float32)
    lazy = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tracemalloc.start()
    expected = _stack_reference(arrays, 0, np.float32)
    dasks = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"3 x 10,000 blocks: stack_blocks {lazy / 1e3:.0f} kB, Dask's stack + rechunk {dasks / 1e6:.1f} MB")
    # under 100 kB for 30,000 blocks: nothing per block (tracemalloc also counts what other threads of this process
    # allocate meanwhile: 62 kB seen once in CI where 50 kB was the bound)
    assert lazy < 100_000 and dasks > 100 * lazy
    key = (cube.name, 0, 50, 7)
    np.testing.assert_array_equal(dask_get(BlockTasks([cube])([key]), key),
                                  np.stack([np.full((4, 4), k, np.float32) for k in (1, 2, 3)]))
    assert cube.chunks == expected.chunks


# ---- Zarr v3 shards: the chunks of a shard are held until it is written --------------------------------------------

HELD = "rasterflow-test-held-chunks"


class HeldChunks(distributed.diagnostics.plugin.SchedulerPlugin):
    """The most results of one layer (``name``) in memory on the cluster at once, at every transition."""

    name = HELD

    def __init__(self, layer: str) -> None:
        self.layer, self.held, self.peak = layer, set(), 0

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if not (isinstance(key, tuple) and key and key[0] == self.layer):
            return
        if finish == "memory":
            self.held.add(key)
        elif start == "memory":
            self.held.discard(key)
        self.peak = max(self.peak, len(self.held))


def _held_peak(dask_scheduler=None) -> int:
    return dask_scheduler.plugins[HELD].peak


def test_sharded_zarr_holds_at_most_two_shards_of_chunks(tmp_path, client):
    """A shard is written whole by one task, so its chunks stay in memory until its last one is done: the writer's
    cap counts chunks, not write tasks, and keeps SHARDS_IN_FLIGHT shard positions in flight (counting write tasks,
    4 per thread would have let 8 tasks = 4 positions = 16 chunks pile up)."""
    from rasterflow.write.shards import SHARDS_IN_FLIGHT

    calls = tmp_path / "calls"
    calls.mkdir()
    band = _source(str(calls))
    client.register_plugin(HeldChunks(band.name), name=HELD)
    try:
        path = str(tmp_path / "sharded.zarr")
        result = write_zarr(_dataset(band), path, fingerprint="fp", client=client, zarr_format=3, shards=2)
        held = client.run_on_scheduler(_held_peak)
    finally:
        client.unregister_scheduler_plugin(HELD)
    assert result.blocks_written == 2 * NBLOCKS
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, _reference())
    np.testing.assert_array_equal(out["water"].values, _reference() * 2)
    assert sorted(_calls(calls)) == sorted(np.ndindex(8, 8))
    print(f"source chunks in memory at most {held} (shards of 2 x 2 chunks, {SHARDS_IN_FLIGHT} in flight)")
    assert 4 <= held <= SHARDS_IN_FLIGHT * 2 * 2


def _exit_now() -> None:
    os._exit(1)


def _plus_one(x: int) -> int:
    return x + 1


def test_a_finished_block_whose_worker_dies_is_computed_again_not_an_error():
    """The race of a worker killed mid-run (seen in CI, tests/test_external_cluster.py): ``as_completed`` gave a
    block back as finished, its worker died before the writer read its status (now ``lost``), and the run stopped
    with "block ... ended as finished" although Dask computed it again. ``settled`` waits for that value."""
    from rasterflow.write.submit import settled

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as own:
        future = own.submit(_plus_one, 41, pure=False)
        assert future.result() == 42
        holder = own.who_has([future])[future.key]
        with pytest.raises(Exception):  # the worker dies before it answers
            own.run(_exit_now, workers=list(holder))
        deadline = time.monotonic() + 30
        while future.status == "finished" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert future.status != "finished", "the worker's death did not reach the client"
        assert settled(future, "block", wanted=True) == 42
        assert future.status == "finished"
        # and when nothing is wanted of it, a finished block is not fetched
        assert settled(future, "block", wanted=False) is None

        cancelled = own.submit(time.sleep, 30, pure=False)
        own.cancel([cancelled])
        with pytest.raises(RuntimeError, match="cancelled from outside"):
            settled(cancelled, "block")


@pytest.mark.parametrize("min_units, most_units", [(None, 1), (3, 3)])
def test_units_larger_than_the_cap_still_keep_min_units_in_flight(min_units, most_units):
    """A unit of 8 keys (a geomedian's 8 variables of one chunk) fills a cap of 8 alone: without ``min_units`` one
    unit runs at a time however many threads there are; with it, that many units are in flight (the Zarr writer
    passes the cluster's threads + QUEUED_UNITS on the fused path)."""
    import dask

    band = da.arange(16 * 8, chunks=1)
    blocks = band.map_blocks(lambda b: b * 2, dtype=band.dtype)
    graph = BlockTasks([blocks])
    state = {"units": 0, "most": 0}
    finished: dict = {}

    def build(keys):
        state["units"] += len(keys) // 8
        state["most"] = max(state["most"], state["units"])
        return graph(keys)

    def on_result(key, value):
        finished[key[1]] = int(value[0])
        if sum(1 for k in finished if k // 8 == key[1] // 8) == 8:
            state["units"] -= 1

    units = ([(blocks.name, 8 * u + k) for k in range(8)] for u in range(16))
    with dask.config.set(scheduler="threads", num_workers=3):
        written = run_units(units, build, total=128, max_in_flight=8, on_result=on_result, min_units=min_units)
    assert written == 128 and finished == {i: 2 * i for i in range(128)}
    assert state["most"] == most_units


def test_the_budget_mirrors_the_writers_caps():
    from rasterflow.budget import constants
    from rasterflow.write import submit

    assert constants.IN_FLIGHT_PER_THREAD == submit.IN_FLIGHT_PER_THREAD
    assert constants.QUEUED_UNITS == submit.QUEUED_UNITS


# ---- reads started before a queued task runs (issue 27) ------------------------------------------------------------

_STARTED: dict[int, str] = {}
"""Chunk -> what happened first to it, in this process: "ahead" (its reads were started) or "ran"."""
_DROPPED: list[int] = []


def _chunk_task(chunk: int) -> np.ndarray:
    _STARTED.setdefault(chunk, "ran")
    return np.full((1,), chunk * 10, dtype=np.int64)


def _chunk_ahead(chunk: int):
    _STARTED.setdefault(chunk, "ahead")
    return lambda: _DROPPED.append(chunk)


def _chunk_array(name: str):
    from rasterflow.layers import lazy_array, prefetch_with

    prefetch_with(_chunk_task, _chunk_ahead)
    return lazy_array(name, (12,), lambda block: (_chunk_task, block[0]), ((1,) * 12,), np.int64)


@pytest.mark.parametrize("where", ["in-process", "threads", "worker-processes"])
def test_a_queued_chunks_reads_start_before_it_is_submitted_where_its_worker_is_this_process(where, client):
    """The writer starts a unit's reads (a task function's registered ``prefetch``) before submitting it, when the
    unit will run in this process (a LocalCluster of in-process workers, or the threaded path): every chunk's reads
    were started before its task ran, and each unit's handle is dropped once it finished. Worker processes start
    nothing here (their tasks' reads would be fetched in the wrong process)."""
    import dask

    _STARTED.clear()
    _DROPPED.clear()
    array = _chunk_array(f"test-ahead-{where}")
    results: dict[int, int] = {}

    def run(on) -> int:
        return run_units(([(array.name, i)] for i in range(12)), BlockTasks([array]), total=12, client=on,
                         max_in_flight=4, on_result=lambda key, value: results.__setitem__(key[1], int(value[0])))

    if where == "in-process":
        with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster, set_as_default=False) as own:
            assert run(own) == 12
    elif where == "threads":
        with dask.config.set(scheduler="threads", num_workers=2):
            assert run(None) == 12
    else:
        assert run(client) == 12
    assert results == {i: 10 * i for i in range(12)}
    if where == "worker-processes":
        assert _STARTED == {} and _DROPPED == []  # the tasks ran in the workers' processes, nothing here
    else:
        assert _STARTED == {i: "ahead" for i in range(12)}
        assert sorted(_DROPPED) == list(range(12))


def _pinned_task(chunk: int, pause: float = 0.0) -> np.ndarray:
    """What the worker process running it knew: whether its reads had been started there, and which process."""
    time.sleep(pause)
    return np.array([chunk * 10, int(_STARTED.get(chunk) == "ahead"), os.getpid()], dtype=np.int64)


def _pinned_ahead(chunk: int, pause: float = 0.0):
    _STARTED.setdefault(chunk, "ahead")
    return lambda: _DROPPED.append(chunk)


def _worker_state() -> tuple[dict[int, str], list[int]]:
    return dict(_STARTED), list(_DROPPED)


def _register_pinned() -> None:
    """In each process, as a task module registers its functions when imported (``rasterflow.tasks``)."""
    from rasterflow.layers import prefetch_with

    _STARTED.clear()
    _DROPPED.clear()
    prefetch_with(_pinned_task, _pinned_ahead)


def test_worker_processes_start_a_units_reads_on_the_worker_it_is_sent_to(client):
    """With worker processes and a unit sent as one task, the writer picks the unit's worker (the fewest units in
    flight per thread), starts the unit's reads there (``Client.run``) and then sends the task there: every task
    found its reads started in its own process; at most one unit waits per worker thread (so the one started is
    the one that runs next); the writer's process starts nothing, and the run's end drops what was started."""
    from rasterflow.layers import lazy_array

    _register_pinned()
    client.run(_register_pinned)
    array = lazy_array("test-pinned", (12,), lambda block: (_pinned_task, block[0]), ((3,) * 12,), np.int64)
    results: dict[int, tuple[int, int, int]] = {}
    in_flight: list[int] = []
    original_submit = client.submit

    def counting_submit(*args, **kwargs):  # the writer's submissions, counted while the tasks are in flight
        in_flight.append(len([f for f in counting_submit.futures if not f.done()]) + 1)
        future = original_submit(*args, **kwargs)
        counting_submit.futures.append(future)
        return future

    counting_submit.futures = []
    client.submit = counting_submit
    try:
        done = run_units(([(array.name, i)] for i in range(12)), BlockTasks([array]), total=12, client=client,
                         max_in_flight=8, one_task_per_unit=True,
                         on_result=lambda key, value: results.__setitem__(key[1], tuple(int(v) for v in value)))
    finally:
        del client.submit
    assert done == 12
    assert {chunk: value[0] for chunk, value in results.items()} == {i: 10 * i for i in range(12)}
    assert all(value[1] == 1 for value in results.values()), results  # each task's reads were started where it ran
    assert len({value[2] for value in results.values()}) == 2  # both workers ran some
    assert max(in_flight) <= 4  # two workers x one thread: one running and one waiting each
    assert _STARTED == {} and _DROPPED == []  # nothing started in the writer's process
    states = client.run(_worker_state)
    started = {chunk for state, _ in states.values() for chunk in state}
    dropped = sorted(chunk for _, drops in states.values() for chunk in drops)
    assert started == set(range(12)) and dropped == list(range(12))


def test_a_worker_that_joins_gets_units_with_their_reads_started_there():
    """An adaptive cluster: a worker that joins during the run is given units (their reads started there too), not
    left idle while the first worker gets every unit."""
    from rasterflow.layers import lazy_array

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster, set_as_default=False) as own:
        _register_pinned()
        own.run(_register_pinned)
        array = lazy_array("test-joins", (16,), lambda block: (_pinned_task, block[0], 0.3), ((3,) * 16,), np.int64)
        results: dict[int, tuple[int, ...]] = {}

        def on_result(key, value) -> None:
            results[key[1]] = tuple(int(v) for v in value)
            if len(results) == 1:
                cluster.scale(2)
                own.wait_for_workers(2)
                own.run(_register_pinned)

        assert run_units(([(array.name, i)] for i in range(16)), BlockTasks([array]), total=16, client=own,
                         max_in_flight=8, one_task_per_unit=True, on_result=on_result) == 16
    assert {chunk: value[0] for chunk, value in results.items()} == {i: 10 * i for i in range(16)}
    by_process: dict[int, list[int]] = {}
    for chunk, value in results.items():
        by_process.setdefault(value[2], []).append(chunk)
    assert len(by_process) == 2, by_process  # the new worker ran some
    assert all(value[1] == 1 for value in results.values()), results


def _plain_task(chunk: int) -> np.ndarray:
    time.sleep(0.05)
    return np.array([chunk * 10, os.getpid()], dtype=np.int64)


def test_units_whose_reads_cannot_start_ahead_are_not_pinned_nor_held_back(client):
    """Local files (nothing to start ahead): the writer leaves the placement to the scheduler and keeps the cap's
    units in flight, as before (no worker chosen, no Client.run)."""
    from rasterflow.layers import lazy_array

    array = lazy_array("test-plain", (12,), lambda block: (_plain_task, block[0]), ((2,) * 12,), np.int64)
    calls: list[dict] = []
    original_submit, original_run = client.submit, client.run
    in_flight: list[int] = []
    futures: list = []

    def counting_submit(*args, **kwargs):
        calls.append(kwargs)
        in_flight.append(len([f for f in futures if not f.done()]) + 1)
        future = original_submit(*args, **kwargs)
        futures.append(future)
        return future

    def no_run(*args, **kwargs):
        raise AssertionError("Client.run was called")

    client.submit, client.run = counting_submit, no_run
    try:
        results: dict[int, int] = {}
        assert run_units(([(array.name, i)] for i in range(12)), BlockTasks([array]), total=12, client=client,
                         max_in_flight=8, one_task_per_unit=True,
                         on_result=lambda key, value: results.__setitem__(key[1], int(value[0]))) == 12
    finally:
        del client.submit, client.run
    assert results == {i: 10 * i for i in range(12)}
    assert all("workers" not in kwargs for kwargs in calls)
    assert max(in_flight) > 4  # the cap (8), not one unit waiting per worker thread


def test_a_worker_keeps_the_drops_of_its_latest_started_reads_only():
    """A long run on a long-lived worker: the drops of reads started ahead are kept for the latest KEEP_STARTED
    units; an older one is called when it is pushed out (a no-op for a task that took its reads over), and the
    run's end calls the rest, so the worker holds no handle per chunk of the run."""
    from rasterflow.layers import KEEP_STARTED, _STARTED_HERE, drop_here, prefetch_here

    _register_pinned()
    token = "test-keep"
    assert prefetch_here(token, [(_pinned_task, (chunk,)) for chunk in range(KEEP_STARTED + 10)]) == KEEP_STARTED + 10
    assert _DROPPED == list(range(10))  # the oldest ten, pushed out in order
    assert len(_STARTED_HERE[token]) == KEEP_STARTED
    drop_here(token)
    assert _DROPPED == list(range(KEEP_STARTED + 10)) and token not in _STARTED_HERE
