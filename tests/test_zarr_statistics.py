"""The STAC statistics of a Zarr output come from the tasks that wrote its chunks (issue 13: the client read the whole
output back after the run, O(output) in one process); chunks this run did not write (an interrupted run's) are read
back. Either way they are what reading every chunk back gives, bit for bit, and what NumPy says of the values."""

from __future__ import annotations

import dataclasses

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

from rasterflow.write.stacstats import BlockStats, zarr_statistics
from rasterflow.write.zarr import write_zarr

SHAPE, CHUNK = (2, 150, 170), (1, 64, 64)  # a leading axis, edge chunks on both spatial axes


def _dataset() -> xr.Dataset:
    rng = np.random.default_rng(13)
    ndvi = rng.normal(0.4, 0.3, SHAPE).astype(np.float32)
    ndvi[rng.random(SHAPE) < 0.2] = np.nan
    ndvi[0, :64, :64] = np.nan  # a chunk with no valid value
    wet = rng.normal(-5, 2, SHAPE).astype(np.float32)
    dims = ("quantile", "y", "x")
    coords = {"quantile": [0.1, 0.9], "y": np.arange(SHAPE[1]) * -10.0 + 5e6, "x": np.arange(SHAPE[2]) * 10.0}
    return xr.Dataset({name: (dims, da.from_array(values, chunks=CHUNK)) for name, values in
                       (("ndvi", ndvi), ("wet", wet))}, coords=coords)


@pytest.mark.parametrize("zarr_format, shards", [(2, None), (3, None), (3, 2)])
def test_the_write_tasks_return_what_reading_back_gives(tmp_path, zarr_format, shards):
    path = str(tmp_path / "out.zarr")
    result = write_zarr(_dataset(), path, fingerprint="stats", zarr_format=zarr_format, shards=shards)
    group = zarr.open_group(path, mode="r")
    for name in ("ndvi", "wet"):
        array = group[name]
        grid = [-(-n // c) for n, c in zip(array.shape, array.chunks)]
        assert set(result.statistics[name]) == set(np.ndindex(*grid)), "every chunk's statistics, from its task"
        for index, stats in result.statistics[name].items():
            region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, array.chunks))
            assert stats == BlockStats.of(np.asarray(array[region]), None if array.fill_value is None
                                          else float(array.fill_value)), (name, index)
    names = ["ndvi", "wet"]
    from_tasks = zarr_statistics(path, names, result.statistics)
    assert from_tasks == zarr_statistics(path, names)  # bit for bit: the same chunks added in the same order
    values = group["ndvi"][...]
    valid = values[~np.isnan(values)].astype(np.float64)
    stats = from_tasks[0]
    assert stats["minimum"] == valid.min() and stats["maximum"] == valid.max()
    assert stats["mean"] == pytest.approx(valid.mean(), rel=1e-9)
    assert stats["stddev"] == pytest.approx(valid.std(), rel=1e-6)
    assert stats["valid_percent"] == pytest.approx(100 * valid.size / values.size)


def test_chunks_not_written_by_this_run_are_read_back_and_the_rest_are_not(tmp_path):
    path = str(tmp_path / "out.zarr")
    result = write_zarr(_dataset(), path, fingerprint="stats")
    names = ["ndvi", "wet"]
    whole = zarr_statistics(path, names)
    # an interrupted run wrote half the chunks: the other half's statistics are read back, the sums are the same
    half = {name: dict(list(chunks.items())[::2]) for name, chunks in result.statistics.items()}
    assert zarr_statistics(path, names, half) == whole
    # what a task returned is used as it is (not read again): a marked chunk shows in the result
    index = next(iter(result.statistics["wet"]))
    marked = {**result.statistics["wet"], index: dataclasses.replace(result.statistics["wet"][index], max=1e9)}
    assert zarr_statistics(path, names, {"wet": marked})[1]["maximum"] == 1e9


STATS_CASES = [
    ("float32", float("nan")), ("float32", -9999.0), ("float32", None), ("float32", 0.1), ("float64", -9999.0),
    ("int16", -32768.0), ("uint8", 0.0), ("uint16", None), ("int32", 7.0), ("uint32", 0.0), ("int8", 1e9),
]


@pytest.mark.parametrize("dtype, nodata", STATS_CASES)
def test_block_statistics_are_the_same_compiled_or_not_and_numpys(dtype, nodata):
    from rasterflow import compiled

    if not compiled.available():
        pytest.skip("the compiled kernels are not built here")
    rng = np.random.default_rng(len(dtype))
    if dtype.startswith("float"):
        values = rng.normal(3, 2, (3, 57, 41)).astype(dtype)
        values[rng.random(values.shape) < 0.3] = np.nan
        if nodata is not None and not np.isnan(nodata):
            values[rng.random(values.shape) < 0.2] = nodata
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, int(info.max) + 1, (3, 57, 41), dtype=dtype)
        if nodata is not None and info.min <= nodata <= info.max:
            values[rng.random(values.shape) < 0.2] = nodata
    strided = values[:, ::2, 1:]  # not contiguous, as a sub-chunk of a shard is
    for block in (values, strided, values[:0]):
        compiled_stats = BlockStats.of(block, nodata, native=True)
        assert compiled_stats == BlockStats.of(block, nodata, native=False)
        keep = ~np.isnan(block) if block.dtype.kind == "f" else np.ones(block.shape, bool)
        if nodata is not None and not np.isnan(nodata):
            keep &= block != nodata
        valid = block[keep].astype(np.float64)
        assert compiled_stats.count == valid.size and compiled_stats.total == block.size
        if valid.size:
            assert compiled_stats.min == valid.min() and compiled_stats.max == valid.max()
            assert compiled_stats.sum == pytest.approx(valid.sum(), rel=1e-12, abs=1e-9)
            assert compiled_stats.sumsq == pytest.approx(np.square(valid).sum(), rel=1e-12)
        else:
            assert compiled_stats == BlockStats(total=block.size)
    if dtype == "float32" and nodata is not None and not np.isnan(nodata):
        assert BlockStats.of(values, nodata).count < np.count_nonzero(~np.isnan(values))  # nodata was left out


def test_the_cog_statistics_pass_keeps_no_block_cache(tmp_path):
    """Every block is read once: GDAL's cache (5% of RAM by default) would only fill with the whole raster, after
    the run's memory samples (the season's client: 0.7 -> 1.1 GB). Measured in a fresh process: its peak RSS above
    what it held before the pass stays far below the raster's 64 MB; the statistics equal NumPy's."""
    import json
    import subprocess
    import sys

    import rasterio

    rng = np.random.default_rng(5)
    values = rng.normal(0.4, 0.2, (4096, 4096)).astype("float32")
    values[:100, :300] = np.nan
    path = tmp_path / "stats.tif"
    import warnings

    from rasterio.errors import NotGeoreferencedWarning

    # a bare raster on purpose (the statistics need no grid; a CRS would add PROJ to the measured process)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        dst = rasterio.open(path, "w", driver="GTiff", width=4096, height=4096, count=1, dtype="float32",
                            nodata=np.nan, tiled=True, blockxsize=512, blockysize=512, compress="ZSTD")
    with dst:
        dst.write(values, 1)
    probe = (
        "import json, sys\n"
        "import rasterio, numpy\n"
        "from rasterflow.write.stacstats import cog_statistics\n"
        "def kb(field):\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(field))\n"
        "open('/proc/self/clear_refs', 'w').write('5')  # the peak RSS starts again from the RSS now\n"
        "before = kb('VmRSS:')\n"
        "stats = cog_statistics(sys.argv[1])\n"
        "print(json.dumps({'grew': (kb('VmHWM:') - before) * 1024, 'stats': stats}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["grew"] < 32 * 2**20, found["grew"]  # without the small cache: the raster's 64 MB and more
    valid = values[~np.isnan(values)]
    (band,) = found["stats"]
    assert band["minimum"] == float(valid.min()) and band["maximum"] == float(valid.max())
    assert band["mean"] == pytest.approx(float(valid.astype("float64").mean()), rel=1e-9)
    assert band["valid_percent"] == pytest.approx(100 * valid.size / values.size)


@pytest.mark.parametrize("zarr_format, encoding", [(2, None), (3, None), (2, "int16"), (3, "int16")])
def test_a_chunk_of_nothing_but_the_fill_value_is_not_stored_and_reads_back_as_it(tmp_path, zarr_format, encoding):
    """A chunk with no valid value (a month of no item, a fully masked chunk) holds only the nodata: where that is
    zarr's fill value no object is stored for it (zarr's own choice, made before it is asked; format 3 keeps an int16
    band's nodata -32768 apart from its fill value 0, so there the chunk is stored); it reads back as nodata, its
    statistics count nothing (format 3 int16 counted its -32768s as valid before) and the STAC item's statistics are
    NumPy's of the valid values."""
    from rasterflow.write.stacstats import zarr_statistics
    from rasterflow.writeplan import Encoding

    ds = _dataset()
    values = ds["ndvi"].values
    path = str(tmp_path / "out.zarr")
    coding = None if encoding is None else Encoding(dtype=encoding, scale=0.001, offset=0.0, nodata=-32768)
    result = write_zarr(ds, path, fingerprint="empty", zarr_format=zarr_format, encoding=coding)
    array = zarr.open_group(path, mode="r")["ndvi"]
    not_stored = 1 if zarr_format == 2 or encoding is None else 0  # ndvi[0, :64, :64]: the only empty chunk
    assert array.nchunks_initialized == array.nchunks - not_stored
    back = xr.open_zarr(path)["ndvi"].values
    expected = values if encoding is None else np.where(np.isnan(values), np.nan,
                                                        np.round(values / 0.001) * 0.001).astype(back.dtype)
    np.testing.assert_allclose(back, expected, rtol=0, atol=1e-6)
    assert np.isnan(back[0, :64, :64]).all()
    assert result.statistics["ndvi"][(0, 0, 0)].count == 0
    assert result.blocks_written == 2 * array.nchunks
    nodata = float("nan") if coding is None else coding.nodata
    stats = zarr_statistics(path, ["ndvi"], result.statistics, nodata=nodata)[0]
    assert stats == zarr_statistics(path, ["ndvi"], nodata=nodata)[0]  # read back: the same
    stored = np.asarray(array[...]).astype(np.float64)
    valid = stored[~np.isnan(stored) & (stored != nodata)]
    assert valid.size == np.count_nonzero(~np.isnan(values))
    assert stats["minimum"] == valid.min() and stats["maximum"] == valid.max()
    assert stats["valid_percent"] == pytest.approx(100 * valid.size / values.size)
