"""Zarr v3 sharding (issue 13, step 3): chunks grouped into shard objects, each shard written whole by one task.

Concurrent shard writes come from a pool of 4 threads (Dask's threaded scheduler); values are checked against
NumPy through xarray, object counts on disk, and an interrupted sharded write resumes shard by shard.
"""

from __future__ import annotations

import os
import threading

import dask
import dask.array as da
import numpy as np
import pytest
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
import zarr
from affine import Affine

from rasterflow.errors import RunFailedError
from rasterflow.write import write_zarr
from rasterflow.write.shards import SHARD_ABOVE_CHUNKS, shard_side

CRS = "EPSG:32633"
TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)
SHAPE = (300, 500)
CHUNK = 64  # 5 x 8 chunks, the last row and column partial


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape).astype(np.float32)
    values[rng.random(shape) < 0.15] = np.nan
    return values


def _coords(shape: tuple[int, int]) -> dict[str, np.ndarray]:
    return {"y": TRANSFORM.f + TRANSFORM.e * (np.arange(shape[0]) + 0.5),
            "x": TRANSFORM.c + TRANSFORM.a * (np.arange(shape[1]) + 0.5)}


def _dataset(values: dict[str, np.ndarray], dims: tuple[str, ...], chunk: int, lead: dict | None = None):
    chunks = (1,) * (len(dims) - 2) + (chunk, chunk)
    shape = next(iter(values.values())).shape[-2:]
    ds = xr.Dataset({name: (dims, da.from_array(v, chunks=chunks)) for name, v in values.items()},
                    coords={**(lead or {}), **_coords(shape)})
    return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM)


def _objects(store: str, var: str) -> list[str]:
    """The chunk (or shard) objects of one array of a v3 store."""
    root = os.path.join(store, var, "c")
    return [os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files]


def _snapshot(path: str) -> dict[str, bytes]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), path)] = f.read()
    return out


@pytest.mark.parametrize("lead", [None, {"period": ["2024-06", "2024-07"]}])
def test_shards_group_chunks_into_few_objects_and_read_back_exactly(tmp_path, lead):
    n_lead = len(lead["period"]) if lead else 1
    shape = ((n_lead,) if lead else ()) + SHAPE
    dims = (("period",) if lead else ()) + ("y", "x")
    values = {"ndvi": _values(1, shape), "water": _values(2, shape)}
    sharded, plain = str(tmp_path / "sharded.zarr"), str(tmp_path / "plain.zarr")
    with dask.config.set(scheduler="threads", num_workers=4):  # shards written from 4 threads at once
        result = write_zarr(_dataset(values, dims, CHUNK, lead), sharded, fingerprint="fp", zarr_format=3, shards=2)
        write_zarr(_dataset(values, dims, CHUNK, lead), plain, fingerprint="fp", zarr_format=3, shards=1)
    assert result.blocks_written == 2 * n_lead * 5 * 8 and result.blocks_skipped == 0
    for name in values:
        # 5 x 8 chunks -> 3 x 4 shards of 2 x 2 chunks (the last row and column of shards partial)
        assert len(_objects(sharded, name)) == n_lead * 3 * 4
        assert len(_objects(plain, name)) == n_lead * 5 * 8
        array = zarr.open_array(sharded, path=name, mode="r")
        lead_chunks = (1,) * len(shape[:-2])
        assert array.chunks == lead_chunks + (CHUNK, CHUNK) and array.shards == lead_chunks + (2 * CHUNK, 2 * CHUNK)
    for path in (sharded, plain):
        out = xr.open_zarr(path)
        for name, expected in values.items():
            np.testing.assert_array_equal(out[name].values, expected)
        assert out.rio.crs.to_epsg() == 32633 and out.rio.transform() == TRANSFORM


def test_a_large_grid_is_sharded_by_default(tmp_path, monkeypatch):
    from rasterflow import writeplan

    # the default shards grids of more than SHARD_ABOVE_CHUNKS chunks: lowered from 1,024 to keep the test small
    # (in rasterflow.writeplan, where shard_side is defined; write.shards re-exports it)
    monkeypatch.setattr(writeplan, "SHARD_ABOVE_CHUNKS", 64)
    shape = (10 * 8, 10 * 8)  # 100 chunks of 8²
    assert shard_side((8, 8), 4, (10, 10)) == 8  # 256-byte chunks: MAX_SHARD_SIDE per side, well below SHARD_BYTES
    values = {"ndvi": _values(3, shape)}
    path = str(tmp_path / "large.zarr")
    with dask.config.set(scheduler="threads", num_workers=4):
        write_zarr(_dataset(values, ("y", "x"), 8), path, fingerprint="fp", zarr_format=3)
    assert len(_objects(path, "ndvi")) == 2 * 2  # instead of 100
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, values["ndvi"])
    # format 2 (GDAL's) has no sharding: one object per chunk
    path2 = str(tmp_path / "large2.zarr")
    with dask.config.set(scheduler="threads", num_workers=4):
        write_zarr(_dataset(values, ("y", "x"), 8), path2, fingerprint="fp")
    assert len([f for f in os.listdir(os.path.join(path2, "ndvi")) if not f.startswith(".")]) == 100


def test_shard_size_follows_the_byte_limit():
    assert shard_side((2048, 2048), 4, (100, 100)) == 2  # 4 chunks of 16 MiB = 64 MiB
    assert shard_side((1024, 1024), 4, (100, 100)) == 4
    assert shard_side((512, 512), 4, (100, 100)) == 8
    assert shard_side((512, 512), 4, (10, 10)) == 1  # 100 chunks: few objects already
    assert 32 * 32 <= SHARD_ABOVE_CHUNKS < 33 * 33
    with pytest.raises(ValueError, match="positive"):
        shard_side((512, 512), 4, (10, 10), 0)


class FaultySource:
    """A lazy band whose chunk function records its calls and fails for one block while ``failing``."""

    def __init__(self, values: np.ndarray, fail_block: tuple[int, int]):
        self.values, self.fail_block, self.failing = values, fail_block, True
        self.calls: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def chunk(self, block_info=None):
        info = block_info[None]
        location = tuple(info["chunk-location"])
        with self._lock:
            self.calls.append(location)
        if self.failing and location == self.fail_block:
            raise RuntimeError(f"injected failure in block {location}")
        return self.values[tuple(slice(a, b) for a, b in info["array-location"])].copy()

    def dataset(self) -> xr.Dataset:
        chunks = tuple(tuple(min(CHUNK, n - s) for s in range(0, n, CHUNK)) for n in SHAPE)
        band = da.map_blocks(self.chunk, chunks=chunks, dtype=np.float32, meta=np.empty((0, 0), np.float32))
        ds = xr.Dataset({"ndvi": (("y", "x"), band), "water": (("y", "x"), band * 2)}, coords=_coords(SHAPE))
        return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM)


def test_an_interrupted_sharded_write_resumes_shard_by_shard(tmp_path):
    values = _values(4, SHAPE)
    path = str(tmp_path / "r.zarr")
    source = FaultySource(values, fail_block=(1, 2))  # in shard (0, 1)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError, match="injected failure"):
            write_zarr(source.dataset(), path, fingerprint="job", zarr_format=3, shards=2)
        markers = os.path.join(path + ".partial", ".rasterflow", "done")
        done = {name: sorted(os.listdir(os.path.join(markers, name))) for name in ("ndvi", "water")}
        assert done == {"ndvi": ["0.0"], "water": ["0.0"]}  # shard (0, 0) finished, (0, 1) failed, rest cancelled
        source.failing = False
        source.calls.clear()
        result = write_zarr(source.dataset(), path, fingerprint="job", zarr_format=3, shards=2)
        # shard (0, 0)'s 4 blocks are not computed again; every other block once
        all_blocks = {(i, j) for i in range(5) for j in range(8)}
        assert sorted(source.calls) == sorted(all_blocks - {(0, 0), (0, 1), (1, 0), (1, 1)})
        assert result.blocks_skipped == 2 * 4 and result.blocks_written == 2 * (40 - 4)
        reference = str(tmp_path / "ref.zarr")
        clean = FaultySource(values, fail_block=(1, 2))
        clean.failing = False
        write_zarr(clean.dataset(), reference, fingerprint="job", zarr_format=3, shards=2)
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, values)
    np.testing.assert_array_equal(out["water"].values, values * 2)
    assert _snapshot(reference) == _snapshot(path)  # equals an uninterrupted write, byte for byte


def test_a_staging_store_with_other_shards_is_not_resumed(tmp_path):
    values = _values(5, SHAPE)
    path = str(tmp_path / "s.zarr")
    source = FaultySource(values, fail_block=(4, 7))
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError):
            write_zarr(source.dataset(), path, fingerprint="job", zarr_format=3, shards=2)
        source.failing = False
        result = write_zarr(source.dataset(), path, fingerprint="job", zarr_format=3, shards=4)
    assert result.blocks_skipped == 0 and result.blocks_written == 2 * 40
    assert zarr.open_array(path, path="ndvi", mode="r").shards == (4 * CHUNK, 4 * CHUNK)
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, values)


def test_format_2_refuses_shards(tmp_path):
    values = {"ndvi": _values(6, SHAPE)}
    with pytest.raises(ValueError, match="Zarr format 3"):
        write_zarr(_dataset(values, ("y", "x"), CHUNK), str(tmp_path / "x.zarr"), fingerprint="fp", shards=2)


# ---- from the spec: output.zarr_shards, and the budget counts what a shard holds --------------------------------


@pytest.mark.slow
def test_a_spec_writes_shards_and_the_plan_counts_them(sample, tmp_path):
    """``output: {zarr_format: 3, zarr_shards: 2}`` on real COGs and a real LocalCluster: 4 x 4 chunks of 64² are
    2 x 2 shard objects per band, the values equal the NumPy median, and ``plan`` counts the shards' held chunk
    results in the peak per worker (the same job unsharded plans exactly that much less)."""
    import json

    from click.testing import CliRunner
    from conftest import spec_text
    from reference import assert_same, load_items, masked_ndvi, reduce_reference

    from rasterflow.cli import cli

    bands = 'ndvi: "(nir - red) / (nir + red)"\ntwice: "ndvi * 2"'
    plans = {}
    for name, output in (("sharded", "{path: out/s.zarr, zarr_format: 3, zarr_shards: 2}"),
                         ("plain", "{path: out/p.zarr, zarr_format: 3}")):
        text = spec_text(sample, reduce="{method: median}", chunks="{time: -1, y: 64, x: 64}", bands=bands)
        (tmp_path / f"{name}.yaml").write_text(text.replace("output: {path: out/result.zarr}", f"output: {output}"))
        planned = CliRunner().invoke(cli, ["plan", str(tmp_path / f"{name}.yaml"), "--json"])
        assert planned.exit_code == 0, planned.output
        plans[name] = json.loads(planned.output)["budget"]
    # the writing worker holds a whole shard's results (4 chunks x 2 bands x 64² float32), its share (1/2 workers) of
    # the next shard's, and one band's shard encoded as float32 and compressed beside it
    chunk = 64 * 64 * 4
    expected = 4 * 2 * chunk + 4 * 2 * chunk // 2 + 2 * 4 * chunk
    # and a finished chunk's 2-band result waiting for the task that writes its shard; unsharded, a chunk's
    # reduction and its writes are one task (write.submit.run_units' one_task_per_unit): nothing waits
    expected += 2 * chunk
    assert plans["sharded"]["held_bytes"] - plans["plain"]["held_bytes"] == expected
    assert plans["sharded"]["peak_per_worker"] - plans["plain"]["peak_per_worker"] == expected

    import contextlib

    with contextlib.chdir(tmp_path):
        result = CliRunner().invoke(cli, ["run", str(tmp_path / "sharded.yaml")])
    assert result.exit_code == 0, result.output
    store = str(tmp_path / "out" / "s.zarr")
    for band in ("ndvi", "twice"):
        assert len(_objects(store, band)) == 2 * 2  # 16 chunks in 4 shard objects
        assert zarr.open_array(store, path=band, mode="r").shards == (128, 128)
    ds = xr.open_zarr(store)
    expected_median = reduce_reference(masked_ndvi(load_items(sample)), "median")
    assert_same(ds["ndvi"].values, expected_median)
    assert_same(ds["twice"].values, 2 * expected_median)


def test_the_budget_sizes_shards_like_the_writer():
    """``budget.shards_per_side`` follows ``write.shards.shard_side`` on the grid (or each tile) in the stored
    dtype: no shards for COG, format 2 or a small grid; the default side for a large v3 grid; the spec's side."""
    from rasterflow.budget import BudgetInputs, PipelineShape, held_for_shards, shards_per_side
    from rasterflow.expr import parse_expression

    def inputs(grid: int) -> BudgetInputs:
        return BudgetInputs(grid_shape=(grid, grid), n_time=10, time_source="search", chunk_time=-1, chunk_y=1024,
                            chunk_x=1024, dtype="float32", threads_per_worker=1, n_workers=2,
                            memory_limit=4 * 2**30, limit_source="spec", gdal_cachemax=64 * 2**20, max_fraction=0.5)

    def shape(**output) -> PipelineShape:
        band = ("ndvi", parse_expression("(nir - red) / (nir + red)", ["red", "nir"]))
        return PipelineShape(assets_loaded=("red", "nir"), mask=None, masked_assets=(), bands=(band,),
                             reduce_method="median", n_quantiles=0, **output)

    large = inputs(40 * 1024)  # 1,600 chunks: above SHARD_ABOVE_CHUNKS
    assert shards_per_side(shape(zarr_format=2), large) == 1
    assert shards_per_side(shape(output_format="cog"), large) == 1
    assert shards_per_side(shape(zarr_format=3), inputs(8 * 1024)) == 1  # 64 chunks
    assert shards_per_side(shape(zarr_format=3), large) == shard_side((1024, 1024), 4, (40, 40)) == 4
    assert shards_per_side(shape(zarr_format=3, stored_dtype="int16"), large) == 4  # 16 x 2 MiB = 32 MiB
    assert shards_per_side(shape(zarr_format=3, stored_dtype="int8"), large) == 8
    assert shards_per_side(shape(zarr_format=3, tile_size=8192), large) == 1  # each 8 x 8-chunk tile a store
    assert shards_per_side(shape(zarr_format=3, zarr_shards=2), inputs(8 * 1024)) == 2
    assert held_for_shards(shape(zarr_format=2), large) == 0
    chunk = 1024 * 1024 * 4
    assert held_for_shards(shape(zarr_format=3), large) == 16 * chunk + 16 * chunk // 2 + 2 * 16 * chunk
    # a store of one shard (8 x 8 chunks in one 8 x 8 shard): the writer has no next shard in flight
    assert held_for_shards(shape(zarr_format=3, zarr_shards=8), inputs(8 * 1024)) == 64 * chunk + 2 * 64 * chunk
    # 2 x 2 shards of 4 x 4 chunks: the next shard's results too, shared by the 2 workers
    assert held_for_shards(shape(zarr_format=3, zarr_shards=4), inputs(8 * 1024)) == \
        16 * chunk + 16 * chunk // 2 + 2 * 16 * chunk
