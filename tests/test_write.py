"""The writers: Zarr and COG round trips, naming, overwrite rules, crash + resume, failure cleanup, a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine
from rio_cogeo.cogeo import cog_validate

from rasterflow.errors import ExitCode, OutputExistsError, RunFailedError
from rasterflow.write import (
    WriteResult,
    check_output_target,
    cog_output_paths,
    is_complete_zarr,
    write_cog,
    write_zarr,
)

CRS = "EPSG:32633"
TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)
SHAPE = (300, 500)  # chunks of 128: 3 × 4 blocks, the last row and column partial
CHUNK = 128
NBLOCKS = 3 * 4


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape).astype(np.float32)
    values[rng.random(shape) < 0.15] = np.nan
    return values


def _georef(ds: xr.Dataset) -> xr.Dataset:
    return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM)


def _yx() -> dict[str, np.ndarray]:
    height, width = SHAPE
    return {
        "y": TRANSFORM.f + TRANSFORM.e * (np.arange(height) + 0.5),
        "x": TRANSFORM.c + TRANSFORM.a * (np.arange(width) + 0.5),
    }


def make_ds(lead: dict[str, list] | None = None, names=("ndvi", "water"), seed: int = 0):
    """A lazy Dataset like the compiler's, and the NumPy values of each variable."""
    lead = lead or {}
    shape = tuple(len(v) for v in lead.values()) + SHAPE
    chunks = (1,) * len(lead) + (CHUNK, CHUNK)
    dims = tuple(lead) + ("y", "x")
    values = {name: _values(seed + k, shape) for k, name in enumerate(names)}
    ds = xr.Dataset(
        {name: (dims, da.from_array(v, chunks=chunks)) for name, v in values.items()},
        coords={**lead, **_yx()},
    )
    return _georef(ds), values


class FaultySource:
    """A lazy 2-D band whose chunk function counts its calls and raises for chosen blocks while ``failing``."""

    def __init__(self, values: np.ndarray, fail_blocks=()):
        self.values = values
        self.fail_blocks = set(fail_blocks)
        self.failing = True
        self.calls: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def _chunk(self, block_info=None):
        info = block_info[None]
        location = tuple(info["chunk-location"])
        with self._lock:
            self.calls.append(location)
        if self.failing and location in self.fail_blocks:
            raise RuntimeError(f"injected failure in block {location}")
        region = tuple(slice(a, b) for a, b in info["array-location"])
        return self.values[region].copy()

    def array(self) -> da.Array:
        chunks = tuple(tuple(min(CHUNK, n - s) for s in range(0, n, CHUNK)) for n in self.values.shape)
        return da.map_blocks(self._chunk, chunks=chunks, dtype=self.values.dtype,
                             meta=np.empty((0, 0), dtype=self.values.dtype))


def faulty_ds(source: FaultySource) -> xr.Dataset:
    band = source.array()
    return _georef(xr.Dataset({"ndvi": (("y", "x"), band), "water": (("y", "x"), band * 2)}, coords=_yx()))


def snapshot(path) -> dict[str, bytes]:
    """Every file under ``path`` (or the file itself) with its bytes."""
    path = str(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": f.read()}
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def assert_georeferenced(obj) -> None:
    assert obj.rio.crs == rasterio.crs.CRS.from_string(CRS)
    assert obj.rio.transform() == TRANSFORM


# --------------------------------------------------------------------------------------------------------------------
# Zarr


@pytest.mark.parametrize("zarr_format", [None, 3])
def test_zarr_round_trip_is_exact_and_georeferenced(tmp_path, zarr_format):
    ds, values = make_ds()
    path = str(tmp_path / "out" / "ndvi.zarr")
    result = write_zarr(ds, path, fingerprint="fp-1", **({"zarr_format": zarr_format} if zarr_format else {}))

    assert isinstance(result, WriteResult)
    assert result.paths == (path,) and result.format == "zarr"
    assert result.blocks_written == 2 * NBLOCKS and result.blocks_skipped == 0
    assert result.bytes_written == sum(len(b) for b in snapshot(path).values()) > 0
    assert sorted(os.listdir(tmp_path / "out")) == ["ndvi.zarr"]  # staging renamed away, nothing else left
    assert not os.path.exists(os.path.join(path, ".rasterflow"))
    if zarr_format == 3:
        with open(os.path.join(path, "zarr.json")) as f:
            root = json.load(f)
        assert root["zarr_format"] == 3 and "consolidated_metadata" in root  # consolidated
    else:  # the default: v2, consolidated in .zmetadata
        with open(os.path.join(path, ".zgroup")) as f:
            assert json.load(f)["zarr_format"] == 2
        with open(os.path.join(path, ".zmetadata")) as f:
            assert "ndvi/.zarray" in json.load(f)["metadata"]
        assert not os.path.exists(os.path.join(path, "zarr.json"))
    assert is_complete_zarr(path)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # opening the result must not warn (consolidated metadata, CRS)
        out = xr.open_zarr(path)
    assert out.attrs["rasterflow_fingerprint"] == "fp-1" and out.attrs["rasterflow_complete"] is True
    assert set(out.data_vars) == {"ndvi", "water"}
    assert_georeferenced(out)
    for name, expected in values.items():
        assert out[name].dtype == np.float32
        assert out[name].encoding["chunks"] == (CHUNK, CHUNK)
        np.testing.assert_array_equal(out[name].values, expected)  # NaN pattern included
    np.testing.assert_array_equal(out["y"].values, ds["y"].values)
    np.testing.assert_array_equal(out["x"].values, ds["x"].values)


def test_zarr_leading_dims_round_trip(tmp_path):
    lead = {"period": ["2024-06", "2024-JJA"], "quantile": [0.1, 0.9]}
    ds, values = make_ds(lead)
    path = str(tmp_path / "pq.zarr")
    result = write_zarr(ds, path, fingerprint="fp")
    assert result.blocks_written == 2 * 2 * 2 * NBLOCKS
    out = xr.open_zarr(path)
    assert list(out["period"].values) == lead["period"]
    np.testing.assert_array_equal(out["ndvi"].sel(period="2024-JJA", quantile=0.9).values, values["ndvi"][1, 1])
    np.testing.assert_array_equal(out["quantile"].values, lead["quantile"])
    assert out["ndvi"].encoding["chunks"] == (1, 1, CHUNK, CHUNK)
    assert_georeferenced(out)
    for name, expected in values.items():
        np.testing.assert_array_equal(out[name].values, expected)


def test_zarr_time_series_keeps_datetimes(tmp_path):
    times = np.array(["2024-06-01", "2024-06-11", "2024-06-21"], dtype="datetime64[ns]")
    ds, values = make_ds({"time": times}, names=("ndvi",))
    path = str(tmp_path / "ts.zarr")
    write_zarr(ds, path, fingerprint="fp")
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["time"].values, times)
    np.testing.assert_array_equal(out["ndvi"].values, values["ndvi"])


@pytest.mark.parametrize("compression, codec", [("zstd", "zstd"), ("deflate", "gzip"), ("lz4", "blosc"),
                                               ("none", None)])
def test_zarr_v3_compression(tmp_path, compression, codec):
    ds, values = make_ds(names=("ndvi",))
    path = str(tmp_path / "c.zarr")
    write_zarr(ds, path, fingerprint="fp", compression=compression, zarr_format=3)
    with open(os.path.join(path, "ndvi", "zarr.json")) as f:
        meta = json.load(f)
    names = [c["name"] for c in meta["codecs"]]
    assert names == ["bytes"] + ([codec] if codec else [])
    if codec == "blosc":
        assert meta["codecs"][1]["configuration"]["cname"] == "lz4"
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, values["ndvi"])


@pytest.mark.parametrize("compression, codec", [("zstd", "zstd"), ("deflate", "zlib"), ("lz4", "blosc"),
                                               ("none", None)])
def test_zarr_v2_compression_opens_in_gdal(tmp_path, compression, codec):
    ds, values = make_ds(names=("ndvi",))
    path = str(tmp_path / "c.zarr")
    write_zarr(ds, path, fingerprint="fp", compression=compression)
    with open(os.path.join(path, "ndvi", ".zarray")) as f:
        meta = json.load(f)
    assert (meta["compressor"] or {}).get("id") == codec
    if codec == "blosc":
        assert meta["compressor"]["cname"] == "lz4"
    np.testing.assert_array_equal(xr.open_zarr(path)["ndvi"].values, values["ndvi"])
    with rasterio.open(f'ZARR:"{path}":/ndvi') as src:  # GDAL decodes every codec we write
        np.testing.assert_array_equal(src.read(1), values["ndvi"])


def test_zarr_lzw_falls_back_to_deflate_with_a_warning(tmp_path):
    ds, values = make_ds(names=("ndvi",))
    with pytest.warns(UserWarning, match="LZW"):
        write_zarr(ds, str(tmp_path / "l.zarr"), fingerprint="fp", compression="lzw")
    np.testing.assert_array_equal(xr.open_zarr(str(tmp_path / "l.zarr"))["ndvi"].values, values["ndvi"])


def test_zarr_refuses_existing_output_and_leaves_it_untouched(tmp_path):
    ds, _ = make_ds(seed=1)
    path = str(tmp_path / "x.zarr")
    write_zarr(ds, path, fingerprint="old")
    before = snapshot(path)
    other, _ = make_ds(seed=2)
    with pytest.raises(OutputExistsError) as err:
        write_zarr(other, path, fingerprint="new")
    assert path in str(err.value) and "set output.overwrite: true or choose another path" in str(err.value)
    assert err.value.exit_code == ExitCode.INVALID == 2
    assert snapshot(path) == before
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]  # no staging store started


def test_zarr_overwrite_replaces_after_the_new_store_is_complete(tmp_path):
    path = str(tmp_path / "x.zarr")
    old, _ = make_ds(seed=1)
    write_zarr(old, path, fingerprint="old")
    new, values = make_ds(seed=2, names=("ndvi",))
    result = write_zarr(new, path, fingerprint="new", overwrite=True)
    assert result.blocks_written == NBLOCKS
    out = xr.open_zarr(path)
    assert set(out.data_vars) == {"ndvi"} and out.attrs["rasterflow_fingerprint"] == "new"
    np.testing.assert_array_equal(out["ndvi"].values, values["ndvi"])
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]  # the old store moved aside was deleted


def test_zarr_failed_overwrite_keeps_the_old_store(tmp_path):
    path = str(tmp_path / "x.zarr")
    old, _ = make_ds(seed=1)
    write_zarr(old, path, fingerprint="old")
    before = snapshot(path)
    source = FaultySource(_values(5, SHAPE), fail_blocks={(1, 1)})
    with dask.config.set(scheduler="synchronous"), pytest.raises(RunFailedError):
        write_zarr(faulty_ds(source), path, fingerprint="new", overwrite=True)
    assert snapshot(path) == before


def test_zarr_resume_computes_only_the_missing_blocks(tmp_path):
    values = _values(7, SHAPE)
    path = str(tmp_path / "r.zarr")
    source = FaultySource(values, fail_blocks={(1, 2)})

    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError, match="injected failure") as err:
            write_zarr(faulty_ds(source), path, fingerprint="job-1")
        assert "resume" in str(err.value)
        assert not os.path.exists(path) and not is_complete_zarr(path)
        staging = path + ".partial"
        assert os.path.isdir(staging) and not is_complete_zarr(staging)
        done = {name: set(os.listdir(os.path.join(staging, ".rasterflow", "done", name)))
                for name in ("ndvi", "water")}
        finished = {tuple(int(i) for i in m.split(".")) for m in done["ndvi"] & done["water"]}
        n_done = len(done["ndvi"]) + len(done["water"])
        assert 0 < n_done < 2 * NBLOCKS

        # a different job may not reuse the staging store, but the same job may, and the output does not exist
        check_output_target(path, "zarr", overwrite=False, fingerprint="job-1")

        source.failing = False
        source.calls.clear()
        result = write_zarr(faulty_ds(source), path, fingerprint="job-1")

    all_blocks = {(i, j) for i in range(3) for j in range(4)}
    # each block position's source is computed at most once (shared by both variables), and never for a
    # position whose blocks were both finished by the first run
    assert len(source.calls) == len(set(source.calls))
    assert set(source.calls) == all_blocks - finished
    assert result.blocks_skipped == n_done
    assert result.blocks_written == 2 * NBLOCKS - n_done

    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["ndvi"].values, values)
    np.testing.assert_array_equal(out["water"].values, values * 2)
    assert_georeferenced(out)
    assert is_complete_zarr(path)
    assert not os.path.exists(path + ".partial")

    # equals an uninterrupted write, byte for byte apart from the run's own bookkeeping
    reference = str(tmp_path / "ref.zarr")
    clean = FaultySource(values)
    clean.failing = False
    write_zarr(faulty_ds(clean), reference, fingerprint="job-1")
    assert snapshot(reference) == snapshot(path)


def test_zarr_staging_of_another_job_is_discarded(tmp_path):
    values = _values(8, SHAPE)
    path = str(tmp_path / "d.zarr")
    source = FaultySource(values, fail_blocks={(2, 3)})
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError):
            write_zarr(faulty_ds(source), path, fingerprint="job-1")
        source.failing = False
        source.calls.clear()
        result = write_zarr(faulty_ds(source), path, fingerprint="job-2")
    assert sorted(set(source.calls)) == sorted((i, j) for i in range(3) for j in range(4))
    assert result.blocks_skipped == 0 and result.blocks_written == 2 * NBLOCKS
    out = xr.open_zarr(path)
    assert out.attrs["rasterflow_fingerprint"] == "job-2"
    np.testing.assert_array_equal(out["ndvi"].values, values)


def test_check_output_target_rules(tmp_path):
    missing = str(tmp_path / "nothing.zarr")
    check_output_target(missing, "zarr", overwrite=False)

    # an unfinished in-place store of the same job may be resumed; of another job it may not
    ds, _ = make_ds(names=("ndvi",))
    inplace = str(tmp_path / "inplace.zarr")
    template = ds.copy()
    template.attrs = {"rasterflow_fingerprint": "fp", "rasterflow_complete": False}
    template.to_zarr(inplace, mode="w", compute=False, consolidated=False)
    assert not is_complete_zarr(inplace)
    check_output_target(inplace, "zarr", overwrite=False, fingerprint="fp")
    with pytest.raises(OutputExistsError, match="inplace.zarr"):
        check_output_target(inplace, "zarr", overwrite=False, fingerprint="other")
    with pytest.raises(OutputExistsError):
        check_output_target(inplace, "zarr", overwrite=False)
    check_output_target(inplace, "zarr", overwrite=True, fingerprint="other")

    # something that is not a Zarr store at all
    (tmp_path / "file.zarr").write_text("not zarr")
    with pytest.raises(OutputExistsError):
        check_output_target(str(tmp_path / "file.zarr"), "zarr", overwrite=False, fingerprint="fp")
    assert not is_complete_zarr(str(tmp_path / "file.zarr"))

    # COG: any of the files it would write
    base = str(tmp_path / "ndvi.tif")
    paths = cog_output_paths(base, {"quantile": [0.1, 0.9]})
    check_output_target(base, "cog", overwrite=False, paths=paths)
    (tmp_path / "ndvi_q0.9.tif").write_bytes(b"x")
    with pytest.raises(OutputExistsError, match="ndvi_q0.9.tif"):
        check_output_target(base, "cog", overwrite=False, paths=paths)
    check_output_target(base, "cog", overwrite=True, paths=paths)


# --------------------------------------------------------------------------------------------------------------------
# COG


def test_cog_output_paths_naming():
    times = np.array(["2024-06-01", "2024-06-11"], dtype="datetime64[ns]")
    assert cog_output_paths("out/ndvi.tif", {}) == ["out/ndvi.tif"]
    assert cog_output_paths("out/ndvi.tif", {"period": ["2024-06", "2024-JJA", "2024"]}) == [
        "out/ndvi_2024-06.tif", "out/ndvi_2024-JJA.tif", "out/ndvi_2024.tif"]
    assert cog_output_paths("ndvi.tif", {"quantile": [0.1, 0.9]}) == ["ndvi_q0.1.tif", "ndvi_q0.9.tif"]
    assert cog_output_paths("o/ndvi.tif", {"period": ["2024-06", "2024-07"], "quantile": [0.5]}) == [
        "o/ndvi_2024-06_q0.5.tif", "o/ndvi_2024-07_q0.5.tif"]
    assert cog_output_paths("ts.tif", {"time": times}) == ["ts_2024-06-01.tif", "ts_2024-06-11.tif"]
    # float32 coordinates still give the short names
    assert cog_output_paths("n.tif", {"quantile": np.array([0.1, 0.9], dtype=np.float32)}) == [
        "n_q0.1.tif", "n_q0.9.tif"]
    ds, _ = make_ds({"quantile": [0.1, 0.9]})
    assert cog_output_paths("n.tif", ds) == ["n_q0.1.tif", "n_q0.9.tif"]
    with pytest.raises(ValueError, match="distinct"):
        cog_output_paths("n.tif", {"period": ["2024", "2024"]})


def _check_cog(path: str, expected: dict[str, np.ndarray], *, overviews: bool) -> None:
    is_valid, errors, warns = cog_validate(path, strict=True)
    assert (is_valid, errors, warns) == (True, [], [])
    with rasterio.open(path) as src:
        assert src.driver == "GTiff"
        assert src.crs == rasterio.crs.CRS.from_string(CRS)
        assert src.transform == TRANSFORM
        assert src.count == len(expected)
        assert src.descriptions == tuple(expected)
        assert all(np.isnan(v) for v in src.nodatavals)
        assert src.dtypes[0] == "float32"
        assert bool(src.overviews(1)) == overviews
        for band, values in enumerate(expected.values(), start=1):
            np.testing.assert_array_equal(src.read(band), values)


def test_cog_round_trip_single_file(tmp_path):
    ds, values = make_ds()
    path = str(tmp_path / "out" / "ndvi.tif")
    result = write_cog(ds, path)
    assert result.paths == (path,) and result.format == "cog"
    assert result.blocks_written == NBLOCKS and result.blocks_skipped == 0
    assert result.bytes_written == os.path.getsize(path)
    assert os.listdir(tmp_path / "out") == ["ndvi.tif"]  # no temporary files left
    _check_cog(path, values, overviews=False)  # 500 × 300 fits in one 512 tile: no overviews needed
    with rasterio.open(path) as src:
        assert src.compression.name == "zstd"
        assert src.block_shapes[0] == (512, 512)


def test_cog_with_overviews_and_deflate(tmp_path):
    ds, values = make_ds(names=("ndvi",))
    path = str(tmp_path / "small_tiles.tif")
    write_cog(ds, path, blocksize=128, compression="deflate", resampling="nearest")
    _check_cog(path, values, overviews=True)
    with rasterio.open(path) as src:
        assert src.compression.name == "deflate"
        assert src.block_shapes[0] == (128, 128)


def test_cog_average_overviews_are_the_mean_of_the_valid_pixels_below(tmp_path):
    """The default overviews (``average``, computed by GDAL's COG driver on every core) are, pixel for pixel, the
    mean of the non-NaN pixels of the 2 x 2 block below them (NaN where all four are NaN)."""
    ds, values = make_ds(names=("ndvi",))
    path = str(tmp_path / "avg.tif")
    write_cog(ds, path, blocksize=128)
    full = values["ndvi"].astype(np.float64)
    blocks = full.reshape(SHAPE[0] // 2, 2, SHAPE[1] // 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks
        expected = np.nanmean(blocks, axis=(1, 3))
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    with rasterio.open(path) as src:
        assert src.overviews(1)[0] == 2
    with rasterio.open(path, overview_level=0) as level:
        got = level.read(1)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_cog_period_and_quantile_files(tmp_path):
    lead = {"period": ["2024-06", "2024-07"], "quantile": [0.1, 0.9]}
    ds, values = make_ds(lead)
    path = str(tmp_path / "ndvi.tif")
    result = write_cog(ds, path, compression="lzw")
    names = ["ndvi_2024-06_q0.1.tif", "ndvi_2024-06_q0.9.tif", "ndvi_2024-07_q0.1.tif", "ndvi_2024-07_q0.9.tif"]
    assert result.paths == tuple(str(tmp_path / n) for n in names)
    assert sorted(os.listdir(tmp_path)) == names
    assert result.blocks_written == 4 * NBLOCKS
    for k, file_path in enumerate(result.paths):
        p, q = divmod(k, 2)
        _check_cog(file_path, {name: v[p, q] for name, v in values.items()}, overviews=False)
        with rasterio.open(file_path) as src:
            assert src.tags()["period"] == lead["period"][p]
            assert float(src.tags()["quantile"]) == lead["quantile"][q]


def test_cog_quantile_only(tmp_path):
    ds, values = make_ds({"quantile": [0.1, 0.9]}, names=("ndvi",))
    result = write_cog(ds, str(tmp_path / "ndvi.tif"))
    assert [os.path.basename(p) for p in result.paths] == ["ndvi_q0.1.tif", "ndvi_q0.9.tif"]
    for k, file_path in enumerate(result.paths):
        _check_cog(file_path, {"ndvi": values["ndvi"][k]}, overviews=False)


def test_cog_refuses_existing_output_and_overwrite_replaces(tmp_path):
    path = str(tmp_path / "x.tif")
    old, _ = make_ds(seed=1)
    write_cog(old, path)
    before = snapshot(path)
    new, values = make_ds(seed=2)
    with pytest.raises(OutputExistsError, match="set output.overwrite: true or choose another path"):
        write_cog(new, path)
    assert snapshot(path) == before

    write_cog(new, path, overwrite=True)
    assert os.listdir(tmp_path) == ["x.tif"]
    _check_cog(path, values, overviews=False)


def test_cog_failure_leaves_no_file(tmp_path):
    source = FaultySource(_values(3, SHAPE), fail_blocks={(1, 2)})
    path = str(tmp_path / "fail.tif")
    with pytest.raises(RunFailedError, match="injected failure"):
        write_cog(faulty_ds(source), path)
    assert os.listdir(tmp_path) == []

    # with overwrite, a failed run keeps the previous output as it was
    old, _ = make_ds(seed=4)
    write_cog(old, path)
    before = snapshot(path)
    with pytest.raises(RunFailedError):
        write_cog(faulty_ds(source), path, overwrite=True)
    assert os.listdir(tmp_path) == ["fail.tif"]
    assert snapshot(path) == before


def test_write_package_import_is_light():
    code = ("import sys, rasterflow.write as w; w.check_output_target; w.path_size; "
            "assert not {'dask', 'xarray', 'rasterio', 'zarr'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------------------------
# a real multi-process cluster


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def test_cluster_writes_zarr(tmp_path, client):
    ds, values = make_ds({"quantile": [0.1, 0.9]})
    path = str(tmp_path / "cluster.zarr")
    result = write_zarr(ds, path, fingerprint="fp", client=client)
    assert result.blocks_written == 2 * 2 * NBLOCKS
    out = xr.open_zarr(path)
    assert_georeferenced(out)
    for name, expected in values.items():
        np.testing.assert_array_equal(out[name].values, expected)


def test_cluster_writes_cog(tmp_path, client):
    ds, values = make_ds({"period": ["2024-06", "2024-07"]})
    result = write_cog(ds, str(tmp_path / "cluster.tif"), client=client)
    assert sorted(os.listdir(tmp_path)) == ["cluster_2024-06.tif", "cluster_2024-07.tif"]
    for k, file_path in enumerate(result.paths):
        _check_cog(file_path, {name: v[k] for name, v in values.items()}, overviews=False)


def test_cluster_cog_failure_cleans_up(tmp_path, client):
    def boom(block, block_info=None):
        if block_info[0]["chunk-location"] == (2, 1):
            raise RuntimeError("worker-side failure")
        return block

    ds, _ = make_ds(names=("ndvi",))
    ds["ndvi"] = ds["ndvi"].copy(data=ds["ndvi"].data.map_blocks(boom, dtype=np.float32))
    with pytest.raises(RunFailedError, match="worker-side failure"):
        write_cog(ds, str(tmp_path / "f.tif"), client=client)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------------------------------
# issue 12: GDAL-readable Zarr v2, encodings, COG options and tags


def test_zarr_v2_is_georeferenced_for_gdal_with_leading_dims(tmp_path):
    from pyproj import CRS as ProjCRS

    lead = {"period": ["2024-06", "2024-07"]}
    ds, values = make_ds(lead)
    path = str(tmp_path / "p.zarr")
    write_zarr(ds, path, fingerprint="fp", metadata={"rasterflow_method": "median", "rasterflow_item_count": 8})
    with open(os.path.join(path, "ndvi", ".zattrs")) as f:
        attrs = json.load(f)
    assert ProjCRS.from_wkt(attrs["_CRS"]["wkt"]).to_epsg() == 32633  # GDAL's own CRS attribute
    assert attrs["grid_mapping"] == "spatial_ref"  # CF, for xarray / rioxarray (GDAL reads it too)
    with rasterio.open(f'ZARR:"{path}":/ndvi') as src:
        assert src.crs == rasterio.crs.CRS.from_string(CRS) and src.transform == TRANSFORM
        assert src.count == 2  # one band per period
        assert [src.tags(b)["DIM_period_VALUE"] for b in (1, 2)] == lead["period"]
        np.testing.assert_array_equal(src.read(), values["ndvi"])
    out = xr.open_zarr(path)
    assert out.attrs["rasterflow_method"] == "median" and out.attrs["rasterflow_item_count"] == 8
    assert list(out["period"].values) == lead["period"]
    assert_georeferenced(out)


def test_zarr_int16_encoding_decodes_and_resumes(tmp_path):
    from rasterflow.write.common import Encoding

    values = np.clip(_values(9, SHAPE), -3, 3)
    source = FaultySource(values, fail_blocks={(2, 1)})
    path = str(tmp_path / "e.zarr")
    encoding = Encoding(dtype="int16", scale=0.001, offset=0.5)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError):
            write_zarr(faulty_ds(source), path, fingerprint="enc", encoding=encoding)
        source.failing = False
        result = write_zarr(faulty_ds(source), path, fingerprint="enc", encoding=encoding)
    assert result.blocks_skipped > 0  # the encoded staging store is resumable (its stored dtype is int16)
    with open(os.path.join(path, "ndvi", ".zarray")) as f:
        meta = json.load(f)
    assert meta["dtype"] == "<i2" and meta["fill_value"] == -32768
    out = xr.open_zarr(path)
    assert out["ndvi"].encoding["scale_factor"] == 0.001 and out["ndvi"].encoding["add_offset"] == 0.5
    np.testing.assert_array_equal(np.isnan(out["ndvi"].values), np.isnan(values))
    np.testing.assert_allclose(out["ndvi"].values, values, atol=0.0005 + 1e-9, equal_nan=True)
    np.testing.assert_allclose(out["water"].values, values * 2, atol=0.0005 + 1e-9, equal_nan=True)
    with rasterio.open(f'ZARR:"{path}":/ndvi') as src:
        assert src.scales == (0.001,) and src.offsets == (0.5,) and src.nodata == -32768
        raw = src.read(1)
    expected = np.where(np.isnan(values), -32768, np.rint((values.astype(np.float64) - 0.5) / 0.001))
    np.testing.assert_array_equal(raw, expected.astype(np.int16))


def test_zarr_staging_of_the_other_format_is_not_resumed(tmp_path):
    source = FaultySource(_values(3, SHAPE), fail_blocks={(0, 0)})
    path = str(tmp_path / "f.zarr")
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RunFailedError):
            write_zarr(faulty_ds(source), path, fingerprint="same", zarr_format=3)
        source.failing = False
        result = write_zarr(faulty_ds(source), path, fingerprint="same")
    assert result.blocks_skipped == 0 and result.blocks_written == 2 * NBLOCKS
    assert os.path.exists(os.path.join(path, ".zgroup")) and not os.path.exists(os.path.join(path, "zarr.json"))


def test_encode_block_never_clips():
    from rasterflow.write.common import Encoding, encode_block

    enc = Encoding(dtype="uint8", scale=0.01).resolved("float32")
    assert enc.nodata == 255 and enc.valid_range() == (0.0, 2.54)
    np.testing.assert_array_equal(encode_block(np.array([0.0, 1.234, np.nan, 2.54]), enc), [0, 123, 255, 254])
    with pytest.raises(ValueError, match="band 'ndvi'.*uint8.*0 .. 2.54"):
        encode_block(np.array([0.5, -0.2]), enc, "ndvi")
    with pytest.raises(ValueError, match="cannot hold"):
        encode_block(np.array([2.55]), enc)  # would be stored as the nodata value
    floats = Encoding(dtype="float32", nodata=-9999).resolved("float32")
    np.testing.assert_array_equal(encode_block(np.array([1.5, np.nan], dtype=np.float32), floats), [1.5, -9999])
    with pytest.raises(ValueError, match="not a valid int16 value"):
        Encoding(dtype="int16", nodata=40000).resolved("float32")


def test_cog_encoding_options_and_tags(tmp_path):
    from rasterflow.write.common import Encoding

    lead = {"period": ["2024-06", "2024-07"]}
    ds, values = make_ds(lead, names=("ndvi",))
    ds["ndvi"] = ds["ndvi"].clip(-1, 1)
    ds["ndvi"].attrs["rasterflow_expression"] = "(nir - red) / (nir + red)"
    path = str(tmp_path / "e.tif")
    paths = cog_output_paths(path, ds)
    result = write_cog(ds, path, encoding=Encoding(dtype="int16", scale=0.0001), blocksize=256, resampling="nearest",
                       predictor="standard", metadata={"rasterflow_method": "median", "rasterflow_quantiles": [0.5]},
                       file_metadata={paths[1]: {"rasterflow_item_count": 3}})
    assert result.paths == tuple(paths)
    for k, file_path in enumerate(paths):
        valid, errors, _warnings = cog_validate(file_path, strict=True)
        assert valid and not errors
        with rasterio.open(file_path) as src:
            assert src.dtypes == ("int16",) and src.nodata == -32768
            assert src.scales == (0.0001,) and src.offsets == (0.0,)
            assert src.block_shapes == [(256, 256)]
            assert src.tags(ns="IMAGE_STRUCTURE").get("PREDICTOR") == "2"
            tags = src.tags()
            assert tags["rasterflow_method"] == "median" and json.loads(tags["rasterflow_quantiles"]) == [0.5]
            assert tags["period"] == lead["period"][k]
            assert ("rasterflow_item_count" in tags) == (k == 1)
            assert src.tags(1)["rasterflow_expression"] == "(nir - red) / (nir + red)"
            raw = src.read(1)
        expected = np.clip(values["ndvi"][k], -1, 1)
        decoded = np.where(raw == -32768, np.nan, raw * 0.0001)
        np.testing.assert_array_equal(np.isnan(decoded), np.isnan(expected))
        np.testing.assert_allclose(decoded, expected, atol=0.00005 + 1e-9, equal_nan=True)


def test_cog_floating_point_predictor_refuses_integers(tmp_path):
    from rasterflow.write.common import Encoding

    ds, _ = make_ds(names=("ndvi",))
    with pytest.raises(ValueError, match="floating_point"):
        write_cog(ds, str(tmp_path / "x.tif"), encoding=Encoding(dtype="int16", scale=0.01),
                  predictor="floating_point")
    assert not os.listdir(tmp_path)


