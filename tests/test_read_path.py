"""The read path on real COGs: raw-value masks, per-pixel mosaics, metadata semantics, and files that fail.

References are independent: rasterio reads (WarpedVRT where the grid differs) and NumPy.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner

from conftest import spec_text
from rasterflow.cli import cli
from reference import assert_same, load_items, read_asset_stack, reduce_reference


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _items_copy(sample, tmp_path: Path, edit=None) -> Path:
    """The sample's items in a new ItemCollection file, optionally edited (``edit(items)`` in place)."""
    items = copy.deepcopy(load_items(sample))
    if edit is not None:
        edit(items)
    path = tmp_path / "items.json"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": items}))
    return path


def _spec(sample, tmp_path: Path, name: str = "spec.yaml", **kwargs) -> Path:
    path = tmp_path / name
    path.write_text(spec_text(sample, **kwargs))
    return path


def _plan(spec: Path):
    from rasterflow.commands import plan_with_items, search
    from rasterflow.planning import local_layout
    from rasterflow.spec import load_spec

    loaded = load_spec(spec)
    items = search(loaded)
    return plan_with_items(loaded, items, local_layout(loaded.spec))


def _compute(plan):
    import dask

    from rasterflow import graph

    with dask.config.set(scheduler="synchronous"):
        return graph.build_dataset(plan).compute()


def _raw_stack(items, asset: str) -> np.ndarray:
    planes = []
    for item in items:
        with rasterio.open(item["assets"][asset]["href"]) as src:
            planes.append(src.read(1))
    return np.stack(planes)


def _ndvi_with_drop(sample, drop: np.ndarray) -> np.ndarray:
    items = load_items(sample)
    red, nir = read_asset_stack(items, "red"), read_asset_stack(items, "nir")
    red, nir = np.where(drop, np.nan, red), np.where(drop, np.nan, nir)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((nir - red) / (nir + red)).astype(np.float32)


# --- the mask sees raw values ----------------------------------------------------------------------------------


def test_qa_bit_mask_runs_on_the_source_integers(sample, tmp_path):
    spec = _spec(sample, tmp_path, mask='"((scl >> 3) & 1) | ((scl >> 1) & 1)"')
    result = _compute(_plan(spec))
    scl = _raw_stack(load_items(sample), "scl").astype(np.int64)
    drop = (((scl >> 3) & 1) | ((scl >> 1) & 1)) != 0
    assert drop.any() and not drop.all()
    assert_same(result["ndvi"].values, _ndvi_with_drop(sample, drop))


def test_scl_class_0_matches_nodata_pixels(sample, tmp_path):
    spec = _spec(sample, tmp_path, mask='"scl in (0, 3, 8, 9, 10)"')
    result = _compute(_plan(spec))
    scl = _raw_stack(load_items(sample), "scl")
    drop = np.isin(scl, (0, 3, 8, 9, 10))
    expected = _ndvi_with_drop(sample, drop)
    assert_same(result["ndvi"].values, expected)
    # the class-0 pixels are dropped, though their red and nir are valid data
    red = _raw_stack(load_items(sample), "red")
    class0_valid = (scl == 0) & (red != 0)
    if class0_valid.any():
        assert np.isnan(result["ndvi"].values[class0_valid]).all()


def test_bit_operations_in_bands_are_refused_by_validate(sample, tmp_path):
    spec = _spec(sample, tmp_path, bands='cloudy: "(scl >> 3) & 1"')
    code, output = _invoke("validate", str(spec))
    assert code == 2, output
    assert "bands.cloudy" in output and "'>>' needs integer" in output and "Traceback" not in output
    assert f"{spec}:" in output


def test_bit_mask_on_a_float_asset_is_refused_with_the_line(sample, tmp_path):
    spec = _spec(sample, tmp_path, mask='"(scl >> 3) & 1"',
                 extra="")
    text = spec.read_text().replace("  assets: {red: red, nir: nir, green: green, scl: scl}",
                                    "  assets: {red: red, nir: nir, green: green, scl: scl}\n"
                                    "  overrides: {scl: {data_type: float32}}")
    spec.write_text(text)
    code, output = _invoke("validate", str(spec))
    assert code == 2, output
    assert "mask" in output and "'>>' needs integer" in output


def test_bit_mask_on_an_asset_the_items_declare_float_exits_2_at_plan(sample, tmp_path):
    def to_float(items):
        for item in items:
            item["assets"]["scl"]["raster:bands"][0]["data_type"] = "float32"

    catalog = _items_copy(sample, tmp_path, to_float)
    spec = _spec(sample, tmp_path, catalog=str(catalog), mask='"(scl >> 3) & 1"')
    assert _invoke("validate", str(spec))[0] != 2  # validate cannot know the items
    code, output = _invoke("plan", str(spec))
    assert code == 2, output
    assert "mask" in output and "float" in output and "Traceback" not in output


# --- items checked against the spec ---------------------------------------------------------------------------


def test_an_asset_key_the_items_lack_exits_2_before_the_cluster(sample, tmp_path):
    spec = _spec(sample, tmp_path)
    spec.write_text(spec.read_text().replace("nir: nir,", "nir: B08,"))
    for command in ("plan", "run"):
        code, output = _invoke(command, str(spec))
        assert code == 2, output
        assert "source.assets.nir" in output and "'B08'" in output and "none of the 8 items" in output
        assert "The items have: green, nir, red, scl" in output
        assert "dashboard" not in output and "Traceback" not in output
        line = next(n for n, text in enumerate(spec.read_text().splitlines(), 1) if "B08" in text)
        assert f"{spec}:{line}:" in output
    assert not (tmp_path / "out" / "result.zarr").exists()


def test_did_you_mean_uses_the_band_name(sample, tmp_path):
    def name_bands(items):
        for item in items:
            item["assets"]["red"]["eo:bands"] = [{"name": "B04", "common_name": "red"}]

    catalog = _items_copy(sample, tmp_path, name_bands)
    spec = _spec(sample, tmp_path, catalog=str(catalog))
    spec.write_text(spec.read_text().replace("{red: red,", "{red: B04,"))
    code, output = _invoke("plan", str(spec))
    assert code == 2 and "did you mean 'red'?" in output, output


def test_an_item_lacking_an_asset_exits_2(sample, tmp_path):
    def drop_nir(items):
        del items[3]["assets"]["nir"]

    catalog = _items_copy(sample, tmp_path, drop_nir)
    spec = _spec(sample, tmp_path, catalog=str(catalog))
    code, output = _invoke("run", str(spec))
    assert code == 2, output
    assert "1 of the 8 items" in output and load_items(sample)[3]["id"] in output
    assert not (tmp_path / "out" / "result.zarr").exists()


# --- files that cannot be read are errors naming them ------------------------------------------------------------


def _break_one_file(sample, tmp_path: Path, how: str) -> tuple[Path, str]:
    items = load_items(sample)
    source = Path(items[2]["assets"]["nir"]["href"])
    broken = tmp_path / f"broken_{how}.tif"
    if how == "missing":
        pass
    elif how == "truncated":
        data = source.read_bytes()
        broken.write_bytes(data[: len(data) // 2])
    elif how == "mistyped":
        with rasterio.open(source) as src:
            profile = src.profile
            values = src.read(1).astype("float32")
        profile.update(dtype="float32", nodata=0.0)
        with rasterio.open(broken, "w", **profile) as dst:
            dst.write(values, 1)

    def point(items):
        items[2]["assets"]["nir"]["href"] = str(broken)

    return _items_copy(sample, tmp_path, point), str(broken)


@pytest.mark.parametrize("how", ["missing", "truncated", "mistyped"])
def test_a_file_that_cannot_be_read_is_an_error_naming_it(sample, tmp_path, how, caplog):
    import logging

    from rasterflow.errors import SourceReadError

    caplog.set_level(logging.DEBUG, logger="rasterflow.read")
    catalog, href = _break_one_file(sample, tmp_path, how)
    spec = _spec(sample, tmp_path, catalog=str(catalog), chunks="{time: -1, y: 256, x: 256}")
    plan = _plan(spec)
    with pytest.raises(SourceReadError) as caught:
        _compute(plan)
    message = str(caught.value)
    assert href in message and "asset 'nir'" in message and load_items(sample)[2]["id"] in message
    if how == "mistyped":
        assert "float32" in message and "uint16" in message
    if how == "truncated":  # the tile decoder failed first and left the file to GDAL, saying why in the log
        assert any(href in r.getMessage() and "truncated" in r.getMessage() for r in caplog.records
                   if r.name == "rasterflow.read"), [r.getMessage() for r in caplog.records]


@pytest.mark.slow
def test_run_with_a_truncated_file_exits_1_and_names_it(sample, tmp_path):
    catalog, href = _break_one_file(sample, tmp_path, "truncated")
    spec = _spec(sample, tmp_path, catalog=str(catalog), output="out/r.zarr")
    code, output = _invoke("run", str(spec))
    assert code == 1, output
    assert href in output and "Traceback" not in output
    assert "stopped by an error" in output and "100%" not in output  # the progress line does not claim success
    assert not (tmp_path / "out" / "r.zarr").exists()
    report = json.loads((tmp_path / "out" / "r.zarr.report.json").read_text())
    assert report["exit_code"] == 1 and href in report["error"]
    # the worker's error reaches the client as itself, not as a bare Exception holding its repr (rasterio's GDAL
    # errors chained under it do not unpickle; tasks._portable_errors drops them)
    assert "ReadFailedError: cannot read" in report["error"] and "Exception: ReadFailedError(" not in report["error"]


# --- metadata semantics ---------------------------------------------------------------------------------------


def _grid():
    from rasterflow.planning import GridPlan

    return GridPlan(crs="EPSG:32633", resolution=10.0, bounds=(0.0, 0.0, 100.0, 100.0), shape=(10, 10))


def _item(properties=None, **asset):
    return {"id": "x", "properties": {"datetime": "2024-06-01T00:00:00Z", **(properties or {})},
            "assets": {"red": {"href": "r.tif", **asset}}}


def test_raster_bands_v1_scale_offset_nodata():
    from rasterflow.sources import resolve_sources

    item = _item(**{"raster:bands": [{"data_type": "uint16", "nodata": 0, "scale": 0.0001, "offset": -0.1}]})
    table = resolve_sources([item], {"red": "red"}, _grid())
    read = table.reads[0][0]
    assert (read.data_type, read.nodata, read.scale, read.offset) == ("uint16", 0.0, 0.0001, -0.1)
    assert table.assets[0].load_dtype == "uint16" and table.assets[0].fill == 0.0


def test_raster_v2_fields_on_the_asset():
    from rasterflow.sources import resolve_sources

    item = _item(**{"data_type": "uint16", "nodata": 0, "raster:scale": 0.0001, "raster:offset": -0.1})
    table = resolve_sources([item], {"red": "red"}, _grid())
    read = table.reads[0][0]
    assert (read.data_type, read.nodata, read.scale, read.offset) == ("uint16", 0.0, 0.0001, -0.1)
    assert table.assets[0].load_dtype == "uint16"
    assert "asset fields" in table.assets[0].applied[0]


def test_stac_11_bands_array():
    from rasterflow.sources import resolve_sources

    item = _item(bands=[{"name": "B04", "data_type": "uint16", "nodata": 0, "raster:scale": 0.0001,
                         "raster:offset": -0.1}])
    read = resolve_sources([item], {"red": "red"}, _grid()).reads[0][0]
    assert (read.data_type, read.nodata, read.scale, read.offset) == ("uint16", 0.0, 0.0001, -0.1)


def test_earthsearch_boa_offset_applied_is_honoured():
    from rasterflow.sources import resolve_sources

    bands = {"raster:bands": [{"data_type": "uint16", "nodata": 0, "scale": 0.0001, "offset": -0.1}]}
    applied = _item({"earthsearch:boa_offset_applied": True}, **bands)
    plain = _item({"earthsearch:boa_offset_applied": False}, **bands)
    table = resolve_sources([applied, plain], {"red": "red"}, _grid())
    assert table.reads[0][0].offset == 0.0 and table.reads[1][0].offset == -0.1
    assert any("earthsearch:boa_offset_applied" in line for line in table.assets[0].applied)


def test_overrides_replace_or_ignore_the_catalog():
    from rasterflow.sources import resolve_sources
    from rasterflow.spec.models import AssetOverride

    item = _item(**{"raster:bands": [{"data_type": "uint16", "nodata": 0, "scale": 0.0001, "offset": -0.1}]})
    table = resolve_sources([item], {"red": "red"}, _grid(),
                            overrides={"red": AssetOverride(offset=0.0, nodata=65535)})
    read = table.reads[0][0]
    assert (read.scale, read.offset, read.nodata) == (0.0001, 0.0, 65535.0)
    ignored = resolve_sources([item], {"red": "red"}, _grid(), overrides={"red": AssetOverride(ignore_catalog=True)})
    read = ignored.reads[0][0]
    assert (read.scale, read.offset, read.nodata, read.data_type) == (1.0, 0.0, None, None)
    assert ignored.assets[0].load_dtype == "float32"


def test_planetary_computer_baseline_4_without_offset_warns_with_the_fix():
    from rasterflow.sources import resolve_sources

    item = _item({"s2:processing_baseline": "05.10"},
                 **{"eo:bands": [{"name": "B04", "center_wavelength": 0.665}],
                    "raster:bands": [{"data_type": "uint16", "nodata": 0}]})
    table = resolve_sources([item], {"red": "red"}, _grid())
    assert len(table.warnings) == 1 and "offset: -0.1" in table.warnings[0]
    old = _item({"s2:processing_baseline": "03.01"}, **{"eo:bands": [{"center_wavelength": 0.665}]})
    assert not resolve_sources([old], {"red": "red"}, _grid()).warnings


def test_override_of_an_unknown_asset_is_a_spec_error(sample, tmp_path):
    spec = _spec(sample, tmp_path)
    spec.write_text(spec.read_text().replace(
        "  assets: {red: red, nir: nir, green: green, scl: scl}",
        "  assets: {red: red, nir: nir, green: green, scl: scl}\n  overrides: {swir: {scale: 0.0001}}"))
    code, output = _invoke("validate", str(spec))
    assert code == 2 and "source.overrides.swir" in output and "not an asset name" in output, output


def test_overrides_apply_in_the_result(sample, tmp_path):
    spec = _spec(sample, tmp_path, mask=None, bands='r: "red"')
    spec.write_text(spec.read_text().replace(
        "  assets: {red: red, nir: nir, green: green, scl: scl}",
        "  assets: {red: red, nir: nir, green: green, scl: scl}\n  overrides: {red: {scale: 2, offset: 1}}"))
    result = _compute(_plan(spec))
    raw = _raw_stack(load_items(sample), "red").astype(np.float32)
    expected = np.where(raw == 0, np.nan, raw * np.float32(2) + np.float32(1))
    assert_same(result["r"].values, expected)


# --- another grid: the WarpedVRT path -----------------------------------------------------------------------------


def test_grid_in_another_utm_zone_matches_a_warpedvrt_reference(sample, tmp_path):
    from affine import Affine
    from pyproj import Transformer
    from rasterio.enums import Resampling
    from rasterio.vrt import WarpedVRT

    transformer = Transformer.from_crs("EPSG:32633", "EPSG:32632", always_xy=True)
    minx, miny, maxx, maxy = transformer.transform_bounds(*sample.bounds)
    minx, maxy = np.floor(minx / 10) * 10 + 200, np.ceil(maxy / 10) * 10 - 200
    width, height = 160, 150
    bounds = (float(minx), float(maxy - 10 * height), float(minx + 10 * width), float(maxy))
    spec = _spec(sample, tmp_path, reduce="{method: median}", chunks="{time: -1, y: 64, x: 64}")
    text = spec.read_text().replace("crs: EPSG:32633", "crs: EPSG:32632")
    text = "\n".join(f"  bounds: {list(bounds)}" if line.startswith("  bounds:") else line
                     for line in text.splitlines()) + "\n"
    spec.write_text(text)
    result = _compute(_plan(spec))

    transform = Affine(10, 0, bounds[0], 0, -10, bounds[3])
    planes = {}
    for asset in ("red", "nir", "scl"):
        stack = []
        for item in load_items(sample):
            meta = item["assets"][asset]
            with rasterio.open(meta["href"]) as src, WarpedVRT(
                src, crs="EPSG:32632", transform=transform, width=width, height=height,
                resampling=Resampling.nearest, nodata=src.nodata,
            ) as vrt:
                raw = vrt.read(1)
            band = meta["raster:bands"][0]
            values = raw.astype(np.float32)
            values[raw == band["nodata"]] = np.nan
            if asset != "scl":
                values = values * np.float32(band.get("scale", 1)) + np.float32(band.get("offset", 0))
            stack.append((raw, values))
        planes[asset] = stack
    drop = np.stack([np.isin(raw, (3, 8, 9, 10)) for raw, _ in planes["scl"]])
    red = np.where(drop, np.nan, np.stack([v for _, v in planes["red"]]))
    nir = np.where(drop, np.nan, np.stack([v for _, v in planes["nir"]]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ndvi = ((nir - red) / (nir + red)).astype(np.float32)
    expected = reduce_reference(ndvi, "median")
    assert np.isfinite(expected).mean() > 0.5
    assert_same(result["ndvi"].values, expected)


def test_plan_says_what_was_applied_per_asset(sample, tmp_path):
    spec = _spec(sample, tmp_path)
    code, output = _invoke("plan", str(spec))
    assert code == 0, output
    assert "red: loaded as uint16" in output
    assert "scale 0.0001" in output and "(raster:bands): 8 items" in output
    code, output = _invoke("plan", "--json", str(spec))
    payload = json.loads(output)
    assert payload["assets"]["scl"]["load_dtype"] == "uint8"


def test_reader_caches_open_files_per_thread(sample, tmp_path, monkeypatch):
    """Files read through GDAL (here every one: RASTERFLOW_TILE_DECODER=gdal) are opened once per thread; with the
    tile decoder, local tiled COGs are not opened by GDAL at all."""
    from rasterflow.read import datasets, read_planes
    from rasterflow.read.tiles import ENV_SWITCH
    from rasterflow import graph

    plan = _plan(_spec(sample, tmp_path))
    job = graph.read_jobs(plan, slice(0, len(plan.items)), (0, 64), (0, 64))
    datasets.clear_cache()
    decoded = read_planes(job, (0, 64), (0, 64))
    assert datasets.open_count() == 0
    monkeypatch.setenv(ENV_SWITCH, "gdal")
    through_gdal = read_planes(job, (0, 64), (0, 64))
    for ours, gdals in zip(decoded.raw, through_gdal.raw):
        np.testing.assert_array_equal(ours, gdals)
    np.testing.assert_array_equal(decoded.nodata, through_gdal.nodata)
    opened = datasets.open_count()
    read_planes(job, (0, 64), (64, 128))
    assert opened == datasets.open_count() == len(plan.items) * len(plan.sources.assets)
    datasets.clear_cache()
    shutil.rmtree(tmp_path, ignore_errors=True)


# --- the per-pixel mosaic, on the kernel itself ----------------------------------------------------------------


def test_solar_day_mosaic_takes_every_asset_of_a_pixel_from_one_tile():
    from rasterflow import kernels
    from rasterflow.expr import parse_expression

    # two overlapping tiles of one pass, 1 x 4 pixels; nodata 0
    red = np.array([[[10, 0, 30, 0]], [[11, 21, 31, 0]]], dtype=np.uint16)
    nir = np.array([[[50, 60, 0, 0]], [[51, 61, 71, 81]]], dtype=np.uint16)
    scl = np.array([[[4, 4, 4, 8]], [[8, 4, 4, 4]]], dtype=np.uint8)
    planes = kernels.Planes(raw=(red, nir, scl), covered=(None, None, None), nodata=np.zeros((2, 3)),
                            scale=np.ones((2, 3)), offset=np.zeros((2, 3)))
    program = kernels.Program(
        assets=("red", "nir", "scl"), mask=parse_expression("scl == 8", ["scl"]), masked_assets=("red", "nir"),
        bands=(("ratio", parse_expression("nir / red", ["red", "nir"])),), dtype="float32", steps=((0, 1),),
    )
    out = kernels.band_block(planes, program)[0, 0, 0]
    # pixel 0: tile 0 valid -> 50/10; pixel 1: tile 0 lacks red -> both from tile 1: 61/21 (not 60/21);
    # pixel 2: tile 0 lacks nir -> 71/31 (not 71/30); pixel 3: tile 0 cloudy and red nodata in tile 1 -> NaN
    np.testing.assert_allclose(out[:3], np.array([50 / 10, 61 / 21, 71 / 31], dtype=np.float32), rtol=1e-6)
    assert np.isnan(out[3])


def test_integer_asset_without_nodata_keeps_coverage():
    from rasterflow import kernels

    raw = np.array([[[0, 7, 0]]], dtype=np.uint8)  # 0 is real data here: no nodata declared
    covered = np.array([[[True, True, False]]])
    planes = kernels.Planes(raw=(raw,), covered=(covered,), nodata=np.full((1, 1), np.nan),
                            scale=np.ones((1, 1)), offset=np.zeros((1, 1)))
    values = kernels.working_plane(planes, 0, 0, np.dtype("float32"))
    assert values[0, 0] == 0 and values[0, 1] == 7 and np.isnan(values[0, 2])


def test_local_files_are_opened_without_gdals_per_file_cache(monkeypatch):
    """GDAL's VSI cache (VSI_CACHE_SIZE per open file, kept for the job) helps remote reads only; a local file gets
    none, so a deep series' open files cost half the memory (benchmarks/README.md); the environment still decides."""
    from rasterflow.gdalenv import VSI_CACHE_SIZE
    from rasterflow.read.datasets import open_options
    from rasterflow.read.policy import policy_from_spec

    monkeypatch.delenv("VSI_CACHE", raising=False)
    policy = policy_from_spec(None)
    assert open_options("/data/S2A/red.tif", policy)["VSI_CACHE"] == "FALSE"
    for href in ("https://example.com/red.tif", "s3://bucket/red.tif", "/vsicurl/https://example.com/red.tif"):
        options = open_options(href, policy)
        assert (options["VSI_CACHE"], options["VSI_CACHE_SIZE"]) == ("TRUE", str(VSI_CACHE_SIZE)), href
    monkeypatch.setenv("VSI_CACHE", "TRUE")
    assert "VSI_CACHE" not in open_options("/data/S2A/red.tif", policy)  # GDAL reads the environment's own


def test_working_plane_sets_nodata_uncovered_and_masked_pixels_to_nan_in_one_pass():
    """The mask, nodata and coverage set NaN after scale and offset: the same values as the reference order (NaN
    first, then scale/offset, then the mask), on random raw values with every combination of the three."""
    from rasterflow import kernels

    rng = np.random.default_rng(7)
    raw = rng.integers(0, 6, size=(2, 64, 64), dtype=np.uint16)  # nodata 0 on ~1/6 of the pixels
    covered = rng.random((2, 64, 64)) > 0.2
    drop = rng.random((64, 64)) > 0.7
    before = drop.copy()
    planes = kernels.Planes(raw=(raw,), covered=(covered,), nodata=np.array([[0.0], [np.nan]]),
                            scale=np.array([[1e-4], [2.0]]), offset=np.array([[-0.1], [0.0]]))
    for t in range(2):
        for mask in (None, drop):
            expected = raw[t].astype(np.float32)
            if t == 0:
                expected[raw[t] == 0] = np.nan
            expected[~covered[t]] = np.nan
            expected = expected * np.float32(planes.scale[t, 0])
            if planes.offset[t, 0] != 0:
                expected = expected + np.float32(planes.offset[t, 0])
            if mask is not None:
                expected[mask] = np.nan
            values = kernels.working_plane(planes, t, 0, np.dtype("float32"), mask)
            np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(drop, before)  # the caller's mask is shared by the assets: left as it was

