"""Bounded submission (issue 13, step 4): the writers keep a capped number of blocks in flight on a real cluster.

A real LocalCluster of 2 worker processes; the scheduler's task count is watched by a scheduler plugin (public
``SchedulerPlugin`` API, read back with ``Client.run_on_scheduler``) at every transition, the client's futures in
the writers' progress callback. Values are compared with a NumPy reference.
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine

from rasterflow.errors import RunFailedError
from rasterflow.write import write_cog, write_zarr
from rasterflow.write.submit import BlockGraph, in_flight_cap, run_units

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


def _source(calls_dir: str, fail_flag: str | None = None, fail_block: tuple[int, int] | None = None) -> da.Array:
    """A lazy band computed block by block on the workers; each block leaves a file in ``calls_dir`` (a worker-side
    counter), and ``fail_block`` raises while ``fail_flag`` exists."""

    def chunk(block_info=None):
        info = block_info[None]
        (r0, r1), (c0, c1) = info["array-location"]
        location = tuple(info["chunk-location"])
        with open(os.path.join(calls_dir, "%d.%d.%d" % (*location, os.getpid())), "w"):
            pass
        if fail_block is not None and location == fail_block and fail_flag and os.path.exists(fail_flag):
            raise RuntimeError(f"injected failure in block {location}")
        rows, cols = np.mgrid[r0:r1, c0:c1]
        values = (np.sin(rows / 7.0) * np.cos(cols / 5.0)).astype(np.float32)
        values[(rows * 31 + cols * 17) % 13 == 0] = np.nan
        return values

    return da.map_blocks(chunk, chunks=((CHUNK,) * 8, (CHUNK,) * 8), dtype=np.float32,
                         meta=np.empty((0, 0), dtype=np.float32))


def _dataset(band: da.Array) -> xr.Dataset:
    height, width = SHAPE
    coords = {"y": TRANSFORM.f + TRANSFORM.e * (np.arange(height) + 0.5),
              "x": TRANSFORM.c + TRANSFORM.a * (np.arange(width) + 0.5)}
    ds = xr.Dataset({"ndvi": (("y", "x"), band), "water": (("y", "x"), band * 2)}, coords=coords)
    return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM)


def _calls(calls_dir) -> list[tuple[int, int]]:
    return [tuple(int(p) for p in name.split(".")[:2]) for name in os.listdir(calls_dir)]


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

    assert result.blocks_written == 2 * NBLOCKS and result.blocks_skipped == 0
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, _reference())
    np.testing.assert_array_equal(out["water"].values, _reference() * 2)
    # every source block computed once (both variables of a block go together, so it is shared)
    assert sorted(_calls(calls)) == sorted(np.ndindex(8, 8))
    assert progress[-1] == (2 * NBLOCKS, 2 * NBLOCKS) and len(progress) == 2 * NBLOCKS
    # a block is 2 tasks (the source shared by both variables, 'water = 2 ndvi' fused into its write: 4 per
    # position); the scheduler holds those of the blocks in flight (<= cap) and of blocks just released that it has
    # not yet forgotten (<= cap): at most 2 x 2 x cap, against all 4 x 64 of an unbounded submission
    held = peak()
    print(f"cap {cap} blocks; scheduler peak {held} tasks; client futures at most {max(futures_seen)}; "
          f"the whole job is {4 * NBLOCKS} tasks")
    assert 0 < held <= 2 * 2 * cap <= 4 * NBLOCKS // 8
    assert max(futures_seen) <= cap


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


def test_a_batch_graph_has_only_the_batch_tasks_and_materialises_no_layer():
    side = 200  # 40,000 blocks
    band = da.ones((side * 4, side * 4), chunks=4, dtype=np.float32)
    out = (band * 2 + 1).map_blocks(lambda b: b[:1, :1].astype(np.int8), chunks=((1,) * side, (1,) * side),
                                    dtype=np.int8)
    build = BlockGraph([out])
    keys = [(out.name, 17, 3), (out.name, 199, 199)]
    graph = build(keys)
    assert set(keys) <= set(graph) and len(graph) <= 2 * 4  # a few tasks per block, fused or not
    assert not any(layer.is_materialized() for layer in out.__dask_graph__().layers.values()
                   if layer.__class__.__name__ == "Blockwise")
    import dask

    values = dask.get(graph, keys)
    assert [v.tolist() for v in values] == [[[3]], [[3]]]


def test_the_local_path_is_bounded_too():
    """No distributed client: a pool of threads, at most ``max_in_flight`` keys submitted and not yet finished."""
    import dask

    band = da.arange(64 * 4, chunks=4)
    blocks = band.map_blocks(lambda b: np.atleast_1d(b.sum()), chunks=((1,) * 64,), dtype=band.dtype)
    graph = BlockGraph([blocks])
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
