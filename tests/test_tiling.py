"""Issue 13 step 3: ``output.tiling`` -- one output per tile (x period), each written and resumed on its own, a STAC
Collection of them and a GDAL VRT mosaic of the COG tiles.

Real runs over the sample scenes (256² px, 8 dates, real COGs) on a grid that reaches 320 px east of the data, cut
into tiles of 192² px (chunks of 64²): a 2 x 3 grid of tiles whose second row is 64 px high, whose middle column is
partly outside the data, and whose last column no input touches (not written: the mosaic shows nodata there).
Every number is compared with the NumPy reference of tests/reference.py, cut to the same windows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from reference import assert_same, load_items, masked_ndvi, months, reduce_reference
from stac_schemas import validate_stac

pytestmark = pytest.mark.slow

SIZE = 192
EXTRA_EAST = 320  # grid columns east of the data: tile column 2 (384..576) is touched by no input
TILING = f"tiling: {{size: {SIZE}}}"
CHUNKS = "{time: -1, y: 64, x: 64}"


def _spec(sample, root: Path, output: str, *, reduce: str = "{method: median, period: month}",
          tiling: str = TILING, chunks: str = CHUNKS, name: str = "spec.yaml") -> Path:
    from conftest import spec_text

    minx, miny, maxx, maxy = sample.bounds
    text = spec_text(sample, output=output, reduce=reduce, chunks=chunks)
    text = text.replace(f"bounds: [{minx}, {miny}, {maxx}, {maxy}]",
                        f"bounds: [{minx}, {miny}, {maxx + 10 * EXTRA_EAST}, {maxy}]")
    text = text.replace(f"output: {{path: {output}}}", f"output: {{path: {output}, {tiling}}}")
    path = root / name
    path.write_text(text)
    return path


def _invoke(spec: Path, *args: str):
    with contextlib.chdir(spec.parent):
        return CliRunner().invoke(cli, ["run", str(spec), *args])


def _run(spec: Path, *args: str) -> str:
    result = _invoke(spec, *args)
    assert result.exit_code == 0, result.output
    return result.output


def _reference(sample) -> dict[str, np.ndarray]:
    """Per month: the masked NDVI median over the whole grid (NaN east of the data)."""
    items = load_items(sample)
    series = masked_ndvi(items)
    labels = np.array(months(items))
    height, width = series.shape[1:]
    out = {}
    for month in dict.fromkeys(labels):
        full = np.full((height, width + EXTRA_EAST), np.nan, dtype=np.float32)
        full[:, :width] = reduce_reference(series[labels == month], "median")
        out[str(month)] = full
    return out


WRITTEN = ("000_000", "000_001", "001_000", "001_001")
EMPTY = ("000_002", "001_002")


def _same(actual: np.ndarray, expected: np.ndarray) -> None:
    """As tests/reference.assert_same, for windows that are partly outside the data (NaN there by design)."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="NaN patterns differ")
    valid = ~np.isnan(expected)
    assert valid.sum() > 0.2 * expected.size, "the reference window is mostly NaN: a weak test"
    assert_same(actual[valid], expected[valid])


def _window(name: str) -> tuple[slice, slice]:
    row, col = (int(v) for v in name.split("_"))
    return slice(row * SIZE, (row + 1) * SIZE), slice(col * SIZE, (col + 1) * SIZE)


@pytest.fixture(scope="module")
def tiled_cog(tmp_path_factory, sample):
    """A monthly median written as COG tiles (3 months x 4 tiles), ``if_exists: skip``."""
    root = tmp_path_factory.mktemp("tiled")
    spec = _spec(sample, root, "out/median.tif", tiling=TILING + ", if_exists: skip")
    output = _run(spec)
    return spec, root / "out", _reference(sample), output


def _months(expected) -> list[str]:
    return sorted(expected)


def test_every_tile_file_exists_and_equals_the_reference_window(tiled_cog):
    _spec_path, out, expected, _output = tiled_cog
    tiles = out / "median"
    for name in WRITTEN:
        for month in _months(expected):
            path = tiles / f"{name}_{month}.tif"
            with rasterio.open(path) as src:
                values = src.read(1)
                rows, cols = _window(name)
                want = expected[month][rows, cols]
                assert values.shape == want.shape
                _same(values, want)
                assert src.tags()["period"] == month
    for name in EMPTY:  # no input touches these: nothing written, no Item
        assert not list(tiles.glob(f"{name}*"))
    assert sorted(p.name for p in tiles.glob("*.tif")) == sorted(
        f"{n}_{m}.tif" for n in WRITTEN for m in _months(expected))


def test_tiles_sit_where_their_window_is(tiled_cog, sample):
    _spec_path, out, _expected, _output = tiled_cog
    minx, _, _, maxy = sample.bounds
    for name in WRITTEN:
        rows, cols = _window(name)
        with rasterio.open(next((out / "median").glob(f"{name}_*.tif"))) as src:
            assert (src.transform.c, src.transform.f) == pytest.approx((minx + 10 * cols.start, maxy - 10 * rows.start))
            assert src.height == min(SIZE, 256 - rows.start)
            assert src.width == SIZE


def test_vrt_mosaic_opens_in_rasterio_and_equals_the_whole_grid(tiled_cog, sample):
    _spec_path, out, expected, _output = tiled_cog
    minx, _, _, maxy = sample.bounds
    for month in _months(expected):
        vrt = out / f"median_{month}.vrt"
        with rasterio.open(vrt) as src:
            assert src.driver == "VRT"
            assert src.crs == rasterio.crs.CRS.from_epsg(32633)
            assert (src.transform.a, src.transform.c, src.transform.e, src.transform.f) == (10, minx, -10, maxy)
            assert (src.height, src.width) == expected[month].shape
            assert src.descriptions == ("ndvi",)
            assert np.isnan(src.nodata)
            values = src.read(1)
            _same(values, expected[month])
            # the mosaic reads at reduced resolution too (GDAL uses the tiles' overviews)
            half = src.read(1, out_shape=(src.height // 2, src.width // 2))
            assert half.shape == (128, (256 + EXTRA_EAST) // 2)
        text = vrt.read_text()
        assert 'relativeToVRT="1"' in text and str(out) not in text  # movable with its tile folder
    assert not (out / "median.tif").exists()


def test_collection_lists_every_tile_and_validates(tiled_cog):
    _spec_path, out, expected, _output = tiled_cog
    collection = json.loads((out / "median.tif.stac-collection.json").read_text())
    validate_stac(collection)  # raises when invalid
    links = [link["href"] for link in collection["links"] if link["rel"] == "item"]
    want = sorted(str(out / "median" / f"{n}_{m}.tif.stac-item.json") for n in WRITTEN for m in _months(expected))
    assert sorted(links) == want
    items = json.loads((out / "median.tif.stac-items.json").read_text())["features"]
    assert sorted(item["id"] for item in items) == sorted(f"{n}_{m}.tif" for n in WRITTEN for m in _months(expected))
    minx = collection["extent"]["spatial"]["bbox"][0][0]
    for href in links:
        item = json.loads(Path(href).read_text())
        assert len(validate_stac(item)) == 5, href  # core + proj, raster, processing, file
        name = Path(href).name[:7]
        rows, cols = _window(name)
        props = item["properties"]
        assert (props["rasterflow:tile_row"], props["rasterflow:tile_col"]) == tuple(int(v) for v in name.split("_"))
        assert props["proj:shape"] == [min(SIZE, 256 - rows.start), SIZE]
        with rasterio.open(item["assets"]["data"]["href"]) as src:
            assert props["proj:transform"] == pytest.approx(list(src.transform)[:6])
            values = src.read(1)
        stats = item["assets"]["data"]["raster:bands"][0]["statistics"]
        assert stats["valid_percent"] == pytest.approx(100 * np.mean(~np.isnan(values)))
        assert item["bbox"][0] >= minx - 1e-9  # the tile's own footprint, inside the collection's
        assert props["rasterflow:period"] in expected


def test_rerun_after_deleting_one_tile_rewrites_only_that_one(tiled_cog, tmp_path_factory, sample):
    spec, out, expected, _output = tiled_cog
    tiles = out / "median"
    month = _months(expected)[1]
    victim = tiles / f"001_000_{month}.tif"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tiles.glob("*.tif")}
    victim.unlink()
    _run(spec)  # an unfinished output of this very job is resumed (the interrupted-run test: with error too)
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tiles.glob("*.tif")}
    assert set(after) == set(before)
    rewritten = sorted(name for name in after if after[name] != before[name])
    # one tile is all the periods of its window: that tile's files, and only them
    assert rewritten == sorted(f"001_000_{m}.tif" for m in _months(expected))
    with rasterio.open(victim) as src:
        _same(src.read(1), expected[month][_window("001_000")])
    report = json.loads((out / "median.tif.report.json").read_text())
    assert report["status"] == "ok"
    assert sorted(o["path"] for o in report["outputs"] if o["path"].endswith(".tif")) == sorted(
        str(tiles / n) for n in after)
    with rasterio.open(out / f"median_{month}.vrt") as src:
        _same(src.read(1), expected[month])


def test_a_run_killed_after_its_last_tile_is_finished_by_the_next(tiled_cog):
    spec, out, expected, _output = tiled_cog
    tiles = out / "median"
    before = {p.name: p.stat().st_mtime_ns for p in tiles.glob("*.tif")}
    for month in _months(expected):  # as if killed after the last tile's marker, before the mosaic and catalog
        (out / f"median_{month}.vrt").unlink()
    (out / "median.tif.stac-items.json").unlink()
    output = _run(spec)  # if_exists: skip: not up to date, since the items file (written last) is missing
    assert "up to date" not in output
    assert {p.name: p.stat().st_mtime_ns for p in tiles.glob("*.tif")} == before  # no tile written again
    features = json.loads((out / "median.tif.stac-items.json").read_text())["features"]
    assert len(features) == len(WRITTEN) * len(expected)
    for month in _months(expected):
        with rasterio.open(out / f"median_{month}.vrt") as src:
            _same(src.read(1), expected[month])


def test_a_complete_tiled_output_is_refused_or_up_to_date(tiled_cog):
    spec, out, _expected, _output = tiled_cog
    before = {p.name: p.stat().st_mtime_ns for p in (out / "median").glob("*.tif")}
    result = _invoke(spec)  # the same job, if_exists: skip
    assert result.exit_code == 0 and "up to date" in result.output, result.output
    refusing = spec.with_name("error.yaml")
    refusing.write_text(spec.read_text().replace(", if_exists: skip", ""))
    refused = _invoke(refusing)  # if_exists: error (the default)
    assert refused.exit_code == 2 and "already exist" in refused.output, refused.output
    assert {p.name: p.stat().st_mtime_ns for p in (out / "median").glob("*.tif")} == before


def test_zarr_tiles_one_store_per_tile(tmp_path, sample):
    spec = _spec(sample, tmp_path, "out/median.zarr", reduce="{method: median}")
    _run(spec)
    items = load_items(sample)
    whole = np.full((256, 256 + EXTRA_EAST), np.nan, dtype=np.float32)
    whole[:, :256] = reduce_reference(masked_ndvi(items), "median")
    stores = sorted(p.name for p in (tmp_path / "out" / "median").glob("*.zarr"))
    assert stores == [f"{n}.zarr" for n in WRITTEN]
    for name in WRITTEN:
        with xr.open_zarr(tmp_path / "out" / "median" / f"{name}.zarr") as ds:
            assert ds.attrs["rasterflow_complete"] is True
            _same(ds["ndvi"].values, whole[_window(name)])
            assert float(ds.x[0]) == pytest.approx(sample.bounds[0] + 10 * _window(name)[1].start + 5)
    collection = json.loads((tmp_path / "out" / "median.zarr.stac-collection.json").read_text())
    validate_stac(collection)
    assert len([link for link in collection["links"] if link["rel"] == "item"]) == len(WRITTEN)
    assert not list((tmp_path / "out").glob("*.vrt"))  # the mosaic is for the COG tiles

    # another tiling over it (--overwrite): tiles of 256 px. 000_000 holds the data; 000_001 only meets the inputs'
    # footprint margin (written, every pixel nodata: a result, valid_percent 0); 000_002 no input touches (not
    # written); the 192-px tiles that the new layout does not have (row 1) are removed with their Items and markers
    wide = _spec(sample, tmp_path, "out/median.zarr", reduce="{method: median}", tiling="tiling: {size: 256}",
                 name="wide.yaml")
    _run(wide, "--overwrite")
    tiles = tmp_path / "out" / "median"
    assert sorted(p.name for p in tiles.glob("*.zarr")) == ["000_000.zarr", "000_001.zarr"]
    assert sorted(p.name for p in (tiles / ".rasterflow").iterdir()) == ["000_000.zarr.json", "000_001.zarr.json"]
    assert sorted(p.name for p in tiles.glob("*.stac-item.json")) == [
        "000_000.zarr.stac-item.json", "000_001.zarr.stac-item.json"]
    with xr.open_zarr(tiles / "000_000.zarr") as ds:
        _same(ds["ndvi"].values, whole[:, :256])
    with xr.open_zarr(tiles / "000_001.zarr") as ds:
        assert ds["ndvi"].shape == (256, 256) and bool(np.isnan(ds["ndvi"].values).all())
    item = json.loads((tiles / "000_001.zarr.stac-item.json").read_text())
    assert item["assets"]["data"]["raster:bands"][0]["statistics"] == {"valid_percent": 0.0}


# --------------------------------------------------------------------------------------------------------------------
# an interrupted run: the finished tiles stay, a rerun writes only the others


def test_interrupted_run_resumes_with_the_unfinished_tiles(tmp_path, sample):
    spec = _spec(sample, tmp_path, "out/median.tif", reduce="{method: median}")
    markers = tmp_path / "out" / "median" / ".rasterflow"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(spec)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            done = [p for p in markers.glob("*.json") if json.loads(p.read_text() or "{}").get("state") == "done"] \
                if markers.exists() else []
            if done:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before a tile was finished: " + (proc.stdout.read() or "")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output
    assert "tiles are finished" in output, output
    finished = {p.name[:7] for p in markers.glob("*.json") if json.loads(p.read_text()).get("state") == "done"}
    assert finished and finished < set(WRITTEN)
    kept = {name: (tmp_path / "out" / "median" / f"{name}.tif").stat().st_mtime_ns for name in finished}
    _run(spec)
    for name, mtime in kept.items():
        assert (tmp_path / "out" / "median" / f"{name}.tif").stat().st_mtime_ns == mtime  # not written again
    items = load_items(sample)
    whole = np.full((256, 256 + EXTRA_EAST), np.nan, dtype=np.float32)
    whole[:, :256] = reduce_reference(masked_ndvi(items), "median")
    with rasterio.open(tmp_path / "out" / "median.vrt") as src:
        _same(src.read(1), whole)


# --------------------------------------------------------------------------------------------------------------------
# the VRT on its own: integer tiles with scale, offset and nodata, a hole where no tile is


def test_vrt_of_scaled_integer_tiles_reads_back_as_their_mosaic(tmp_path):
    from affine import Affine

    from rasterflow.write.vrt import VrtSource, vrt_text

    rng = np.random.default_rng(0)
    whole = rng.integers(-1000, 1000, size=(2, 48, 80)).astype(np.int16)  # two bands
    whole[:, 32:, 40:] = -32768  # the tile that is not written: nodata in the mosaic
    origin = Affine(20.0, 0.0, 400000.0, 0.0, -20.0, 5800000.0)
    sources = []
    (tmp_path / "t").mkdir()
    for row, col, rows, cols in ((0, 0, slice(0, 32), slice(0, 40)), (0, 40, slice(0, 32), slice(40, 80)),
                                 (32, 0, slice(32, 48), slice(0, 40))):
        path = tmp_path / "t" / f"{row}_{col}.tif"
        block = whole[:, rows, cols]
        with rasterio.open(path, "w", driver="GTiff", width=block.shape[2], height=block.shape[1], count=2,
                           dtype="int16", crs="EPSG:32633", transform=origin @ Affine.translation(col, row),
                           nodata=-32768, tiled=True, blockxsize=16, blockysize=16) as dst:
            dst.write(block)
            dst.scales, dst.offsets = (0.001, 0.001), (-1.0, -1.0)
        sources.append(VrtSource(path=str(path), row=row, col=col, height=block.shape[1], width=block.shape[2],
                                 block=(16, 16)))
    vrt = tmp_path / "mosaic.vrt"
    vrt.write_text(vrt_text(str(vrt), width=80, height=48, crs="EPSG:32633", transform=tuple(origin)[:6],
                            dtype="int16", band_names=["a", "b"], sources=sources, nodata=-32768, scale=0.001,
                            offset=-1.0))
    with rasterio.open(vrt) as src:
        assert (src.count, src.height, src.width, src.dtypes) == (2, 48, 80, ("int16", "int16"))
        assert src.transform == origin and src.crs == rasterio.crs.CRS.from_epsg(32633)
        assert src.nodata == -32768 and src.scales == (0.001, 0.001) and src.offsets == (-1.0, -1.0)
        assert src.descriptions == ("a", "b")
        np.testing.assert_array_equal(src.read(), whole)
        np.testing.assert_array_equal(src.read(1, window=((20, 40), (30, 60))), whole[0, 20:40, 30:60])


# --------------------------------------------------------------------------------------------------------------------
# the spec


@pytest.mark.parametrize("tiling, chunks, message", [
    ("tiling: {size: 100}", CHUNKS, "100 is not a multiple of chunks.y (64)"),
    ("tiling: {size: 128}", "{time: -1, y: 64, x: 96}", "128 is not a multiple of chunks.x (96)"),
    ("tiling: {size: 128}", "{time: -1, y: -1, x: 64}", "chunks.y to be a number of pixels, not -1"),
    ("tiling: {size: 0}", CHUNKS, "greater than 0"),
    ("tiling: {size: 128, grid: mgrs}", CHUNKS, "unknown key 'grid'"),
])
def test_bad_tiling_is_a_spec_error_with_line_and_field(tmp_path, sample, tiling, chunks, message):
    spec = _spec(sample, tmp_path, "out/median.tif", tiling=tiling, chunks=chunks)
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), start=1) if "tiling" in text)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert f"{spec.name}:{line}:" in result.output or f":{line}:" in result.output, result.output
    assert "output.tiling" in result.output, result.output


def test_tiling_refuses_if_exists_update(tmp_path, sample):
    spec = _spec(sample, tmp_path, "out/median.tif", tiling=TILING + ", if_exists: update")
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "update is not available with tiling" in result.output, result.output
