"""The graph is built lazily per batch (issue 13, step 4): the client holds O(batch) of it, not O(job).

``graph.build_dataset`` gives each array a read-only layer (``layers.TaskLayer``) that makes a chunk's task when a
writer's batch asks for it; each band is its own such layer of selections (no Dask slicing/rechunking layers of
O(chunks)). Checked on a real 2 × 2 tile sample (``rasterflow.sample``: COGs written by rasterio):

- every key's task is the one the materialised layer held before (a dict built here by the former loop), equal and
  pickled to the same bytes, for the fused path (with and without solar-day steps), the series path (time chunked)
  and a plan without a chunk index; membership, iteration order and length are those of that dict;
- each variable has the dims, chunks and values, bit for bit, of the former construction (the materialised dict
  sliced and rechunked by Dask), on the fused (period and quantile dims), series and tree paths, and the tree path's
  monthly mean is the fused path's to float rounding;
- Zarr and COG writes (``write.submit.BlockTasks``, local threads) of a lazy Dataset equal its computed values;
- on ``benchmarks/plan_scale.py``'s synthetic job (10 tiles x 10 dates), ``tracemalloc``: ``build_dataset`` of
  40,000 chunks allocates within 1 MB of the 2,500-chunk build (the materialised layers cost ≥ 2 KB per chunk,
  ~80 MB more), and the first batch's graph of 16 blocks is < 1 MB.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pickle
import tracemalloc
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from conftest import spec_text
from dask.highlevelgraph import HighLevelGraph
from reference import load_items

from rasterflow import graph, kernels
from rasterflow.paths import tree
from rasterflow.planning import make_plan
from rasterflow.sizing import WorkerLayout
from rasterflow.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CHUNK = 40
LAYOUT = WorkerLayout(n_workers=2, threads_per_worker=1, memory_limit=2 * 10**9, source="local")


def _plan(sample, tmp_path: Path, **kwargs):
    spec = tmp_path / "spec.yaml"
    kwargs.setdefault("chunks", f"{{time: -1, y: {CHUNK}, x: {CHUNK}}}")
    spec.write_text(spec_text(sample, **kwargs))
    return make_plan(load_spec(spec).spec, items=load_items(sample), layout=LAYOUT)


def _old_layer(plan, name: str, function, time_chunks: tuple[int, ...], n_leading: int, extra: tuple = ()) -> dict:
    """The layer ``graph.task_array`` materialised before: the former loop, verbatim but for the names."""
    program = plan.program
    cy, cx = plan.chunks["y"], plan.chunks["x"]
    height, width = plan.grid.shape
    y_chunks = tuple(min(cy, height - start) for start in range(0, height, cy))
    x_chunks = tuple(min(cx, width - start) for start in range(0, width, cx))
    layer: dict = {}
    n_items = len(plan.items)
    edges = np.cumsum((0, *time_chunks))
    item_edges = [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])] if not program.steps else [(0, n_items)]
    index = plan.chunk_index
    one_box = ([len({read.footprint for read in reads}) == 1 for reads in plan.sources.reads]
               if index is not None else None)
    step_of = None
    if program.steps:
        step_of = np.zeros(n_items, dtype=np.int64)
        for d, indices in enumerate(program.steps):
            step_of[list(indices)] = d

    def bounds(chunks):
        e = np.cumsum((0, *chunks))
        return [(int(a), int(b)) for a, b in zip(e[:-1], e[1:])]

    for k, (t0, t1) in enumerate(item_edges):
        for i, rows in enumerate(bounds(y_chunks)):
            for j, cols in enumerate(bounds(x_chunks)):
                key = (name, k) + (0,) * (n_leading - 1) + (i, j)
                if index is None:
                    layer[key] = (function, graph.read_jobs(plan, slice(t0, t1), rows, cols), rows, cols, program,
                                  None, *extra)
                    continue
                local = index.items_of(i, j)
                if t0 > 0 or t1 < n_items:
                    local = local[np.searchsorted(local, t0):np.searchsorted(local, t1)]
                items = local.tolist()
                view = kernels.task_items(program, items, t0, t1 - t0, step_of)
                layer[key] = (function, graph.local_read_job(plan, items, rows, cols, one_box), rows, cols, program,
                              view, *extra)
    return layer


def _root(dataset: xr.Dataset) -> tuple[str, object]:
    """The name and layer of the read tasks (``chunk_reduce`` or ``chunk_bands``) under the dataset's variables."""
    layers = dataset[next(iter(dataset.data_vars))].data.__dask_graph__().layers
    def reads(layer) -> bool:
        task = layer[next(iter(layer))]
        return isinstance(task, tuple) and task[0] in (graph.chunk_reduce, graph.chunk_bands)

    (name,) = [n for n, layer in layers.items() if reads(layer)]
    return name, layers[name]


def _time_chunks(plan) -> tuple[int, ...]:
    n, per = len(plan.items), plan.chunks["time"]
    return tuple(min(per, n - s) for s in range(0, n, per))


def _untokened(task):
    """The task with its read jobs' tokens left out: each job is a new object with its own (ReadJob.token, unique
    in the process, is what dask's tokenize sees of it); everything else must be the same bit for bit."""
    from rasterflow.read import ReadJob

    if isinstance(task, ReadJob):
        return ("ReadJob", task.reads, task.assets, task.grid, task.resampling)
    if isinstance(task, tuple):
        return tuple(_untokened(part) for part in task)
    return task


CASES = {
    "median": dict(reduce="{method: median}"),
    "solar-day quantiles by month": dict(reduce="{method: quantile, q: [0.1, 0.5, 0.9], period: month}",
                                         group_by="solar_day"),
    "series, time chunked by 3": dict(chunks=f"{{time: 3, y: {CHUNK}, x: {CHUNK}}}",
                                      bands='ndvi: "(nir - red) / (nir + red)"\nwet: "where(isnan(nir), -1, nir)"'),
}


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_lazy_layer_gives_the_materialised_layers_tasks(four_tiles, tmp_path, case, indexed):
    plan = _plan(four_tiles, tmp_path, **CASES[case])
    if not indexed:
        plan = dataclasses.replace(plan, chunk_index=None)
    name, layer = _root(graph.build_dataset(plan))
    series = plan.program.reduce_method is None
    function = graph.chunk_bands if series else graph.chunk_reduce
    old = _old_layer(plan, name, function, _time_chunks(plan), 2 if series else 3,
                     () if series else (plan.report.sub_block, plan.sub_blocks_across))
    n_time = 6 if series else 1  # 16 items by 3
    assert len(old) == n_time * 5 * 5 == len(layer)  # 2 × 2 tiles of 96 px: 192 px, in 40 px chunks: 5 × 5
    assert list(layer) == list(old)  # the same keys, in the same order
    for key, task in old.items():
        assert key in layer
        made = layer[key]
        assert made == task and pickle.dumps(_untokened(made)) == pickle.dumps(_untokened(task)), key
    # numpy integers index as Python's do; anything else is not a key
    first = next(iter(old))
    assert (first[0], *(np.int64(k) for k in first[1:])) in layer
    for other in [(name, *first[1:-1], 5), (name, *first[1:-1], -1), (name, *first[1:]) + (0,), first[1:], name,
                  (name + "x", *first[1:]), (name, *first[1:-1], 0.0), ((name,), 0)]:
        assert other not in layer
        with pytest.raises(KeyError):
            layer[other]


def _old_variables(plan, dataset) -> dict[str, da.Array]:
    """The variables as built before: the materialised root layer, sliced and rechunked by Dask."""
    name, layer = _root(dataset)
    program = plan.program
    root_chunks = layer.collection_annotations["chunks"]  # set by dask.array.Array for its layer
    root = da.Array(HighLevelGraph.from_collections(name, dict(layer), dependencies=()), name, root_chunks,
                    meta=np.empty((0,) * len(root_chunks), dtype=program.dtype))
    keep = (bool(plan.period_labels), plan.quantile_dim)
    out = {}
    for b, band in enumerate(program.band_names):
        if program.reduce_method is None:
            out[band] = root[:, b].rechunk({0: 1})
        elif layer[next(iter(layer))][0] is graph.chunk_reduce:
            out[band] = graph._reduced_dims(root[:, :, b], *keep)[1]
        else:  # the tree path: time chunked, reduced by the tree's own layers over the band sliced by Dask
            out[band] = graph.reduced_band(tree._tree_reduce(root[:, b], program, band), 0, band, *keep)[1]
    return out


TREE = dict(chunks=f"{{time: 3, y: {CHUNK}, x: {CHUNK}}}", reduce="{method: mean, period: month}")


@pytest.mark.parametrize("case", [*CASES, "tree: monthly mean, time chunked by 3"])
def test_variables_equal_the_sliced_and_rechunked_materialised_layer(four_tiles, tmp_path, case):
    options = CASES.get(case, TREE)
    plan = _plan(four_tiles, tmp_path, **options)
    dataset = graph.build_dataset(plan)
    old = _old_variables(plan, dataset)
    assert set(old) == set(dataset.data_vars)
    computed = dataset.compute(scheduler="synchronous")
    for band, before in old.items():
        lazy = dataset[band].data
        assert lazy.chunks == before.chunks and lazy.dtype == before.dtype, band
        # each band is one lazy layer of selections over the read layer (the tree path: over its reduction)
        if case in CASES:
            assert len(lazy.__dask_graph__().layers) == 2
        np.testing.assert_array_equal(computed[band].values, before.compute(scheduler="synchronous"), err_msg=band)
    if case == "solar-day quantiles by month":
        assert computed["ndvi"].dims == ("period", "quantile", "y", "x")
        assert dataset["ndvi"].data.chunks[:2] == ((1, 1, 1), (1, 1, 1))  # every month of the window
    if case not in CASES:
        # the tree's monthly mean is the fused path's (time whole) to float rounding
        whole = _plan(four_tiles, tmp_path, reduce="{method: mean, period: month}")
        fused = graph.build_dataset(whole).compute(scheduler="synchronous")
        np.testing.assert_allclose(computed["ndvi"].values, fused["ndvi"].values, rtol=2e-6, atol=1e-7)
        assert computed["ndvi"].dims == ("period", "y", "x")


def test_zarr_and_cog_writes_of_the_lazy_dataset_equal_its_values(four_tiles, tmp_path):
    import rioxarray

    from rasterflow.write import write_cog, write_zarr

    plan = _plan(four_tiles, tmp_path, reduce="{method: median}",
                 bands='ndvi: "(nir - red) / (nir + red)"\nred_out: "red"')
    dataset = graph.build_dataset(plan)
    expected = dataset.compute(scheduler="synchronous")
    with dask.config.set(scheduler="threads", num_workers=2):
        result = write_zarr(dataset, str(tmp_path / "out.zarr"), fingerprint="lazy")
        assert result.blocks_written == 2 * 25
        cog = write_cog(dataset, str(tmp_path / "out.tif"))
    stored = xr.open_zarr(tmp_path / "out.zarr")
    for band in ("ndvi", "red_out"):
        np.testing.assert_array_equal(stored[band].values, expected[band].values)
    tif = rioxarray.open_rasterio(cog.paths[0]).values
    np.testing.assert_array_equal(tif, np.stack([expected["ndvi"].values, expected["red_out"].values]))


def _bench():
    spec = importlib.util.spec_from_file_location("plan_scale", REPO / "benchmarks" / "plan_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _traced(function, *args):
    tracemalloc.start()
    try:
        value = function(*args)
        return value, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_client_graph_memory_does_not_grow_with_the_chunks(tmp_path):
    from rasterflow.commands import plan_command
    from rasterflow.write.submit import BlockTasks

    bench = _bench()
    folder = tmp_path / "job"
    built = {}
    for chunk in (704, 176):  # 44 × 58 = 2,552 and 175 × 231 = 40,425 chunks of a 30,744 × 40,626 px grid
        plan = plan_command(load_spec(bench.write_job(folder, 10, 10, chunk=chunk))).plan
        graph.build_dataset(plan)  # imports and caches
        dataset, nbytes = _traced(graph.build_dataset, plan)
        built[chunk] = (plan, dataset, nbytes)
    small, large = built[704], built[176]
    chunks = [math.prod(d["ndvi"].data.numblocks) for _, d, _ in (small, large)]
    assert chunks == [2_552, 40_425]
    grown = large[2] - small[2]
    print(f"build_dataset: {small[2] / 1e6:.2f} MB at {chunks[0]:,} chunks, {large[2] / 1e6:.2f} MB at "
          f"{chunks[1]:,} ({grown / (chunks[1] - chunks[0]):.1f} B per added chunk)")
    # the materialised layers cost >= 2 KB per chunk (a read task and its selection): ~76 MB more here
    assert grown < 10**6
    # the first batch of a write: 16 blocks' graph, the read tasks made for them only
    plan, dataset, _ = large
    array = dataset["ndvi"].data
    keys = [(array.name, 87, j) for j in range(100, 116)]
    batch, nbytes = _traced(lambda: BlockTasks([array])(keys))
    assert len(batch.roots) == len(keys)
    assert nbytes < 10**6, nbytes
    print(f"first batch (16 blocks): {nbytes / 1e3:.0f} kB")


def test_the_layer_pickles_and_a_distributed_compute_sees_the_same_values(four_tiles, tmp_path):
    """The layer pickles (an HLG shipped whole to a scheduler) and a whole-dataset compute on a real cluster gives
    the synchronous values."""
    distributed = pytest.importorskip("distributed")
    plan = _plan(four_tiles, tmp_path, reduce="{method: quantile, q: [0.25, 0.75], period: month}")
    dataset = graph.build_dataset(plan)
    _, layer = _root(dataset)
    copy = pickle.loads(pickle.dumps(layer))
    assert list(copy) == list(layer) and all(copy[k] == layer[k] for k in layer)
    expected = dataset.compute(scheduler="synchronous")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with distributed.Client(cluster, set_as_default=False) as client:
            computed = client.compute(dataset).result()
    for band in expected.data_vars:
        np.testing.assert_array_equal(computed[band].values, expected[band].values)


def test_an_item_stream_refills_one_set_of_buffers_with_each_items_own_pixels(four_tiles, tmp_path):
    """item_stream reads every item into the arrays of the item before (no allocation per item); each read holds
    exactly what read_planes gives for that item alone."""
    from rasterflow.read import ReadJob, gdal_env, item_stream, read_planes

    plan = _plan(four_tiles, tmp_path)
    rows = cols = (40, 136)  # across the tiles' edges: each item covers part of the window, the rest is fill
    job = graph.read_jobs(plan, slice(0, len(plan.items)), rows, cols)
    stream = item_stream(job, rows, cols)
    seen = []
    with gdal_env():
        for t in range(stream.n_items):
            planes = stream.read(t)
            seen.append(planes.raw[0])
            alone = read_planes(ReadJob(reads=(job.reads[t],), assets=job.assets, grid=job.grid,
                                        resampling=job.resampling), rows, cols)
            for got, want in zip(planes.raw, alone.raw):
                np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(planes.nodata, alone.nodata)
            np.testing.assert_array_equal(planes.scale, alone.scale)
    assert stream.n_items > 1 and all(array is seen[0] for array in seen)


def test_a_read_job_is_tokenized_by_its_own_token(four_tiles, tmp_path):
    """dask tokenizes every task's arguments when the client submits a batch; a job's ~100 asset reads walked field
    by field cost ~10 ms a task. A job is one object per task: its token is made with it, unique, and stable."""
    from dask.base import tokenize

    plan = _plan(four_tiles, tmp_path, reduce="{method: median}")
    job = graph.local_read_job(plan, range(len(plan.sources.reads)), (0, 40), (0, 40))
    same = graph.local_read_job(plan, range(len(plan.sources.reads)), (0, 40), (0, 40))
    assert job == same  # the same reads...
    assert tokenize(job) == tokenize(job) and tokenize(job) != tokenize(same)  # ...but two objects, two tokens
    assert tokenize(dataclasses.replace(job, resampling="bilinear")) != tokenize(job)
