"""The real STAC item fixtures (tests/data/stac) and the sparse-raster generator in tests/real_items.py."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.errors import RasterioIOError
from rasterio.windows import Window
from real_items import (
    FIXTURES,
    asset_geometry,
    center_region,
    expected_pixels,
    load_item,
    materialize,
    region_window,
    truncate,
)

# the assets each fixture is checked with (reflectance bands, the classification / QA band, one other grid)
ASSETS = {
    "earthsearch_s2_l2a": ("red", "nir", "scl", "nir08", "coastal", "visual"),
    "pc_s2_l2a_a": ("B04", "B08", "SCL", "B01"),
    "pc_s2_l2a_b": ("B04", "B08", "SCL"),
    "stac11_raster_v2": ("B04_10m", "B08_10m", "SCL_20m", "B01_60m", "TCI_10m"),
    "landsat_c2_l2": ("red", "nir08", "qa_pixel", "lwir11"),
}
RED = {"earthsearch_s2_l2a": "red", "pc_s2_l2a_a": "B04", "pc_s2_l2a_b": "B04", "stac11_raster_v2": "B04_10m",
       "landsat_c2_l2": "red"}
MASK = {"earthsearch_s2_l2a": "scl", "pc_s2_l2a_a": "SCL", "pc_s2_l2a_b": "SCL", "stac11_raster_v2": "SCL_20m",
        "landsat_c2_l2": "qa_pixel"}


def _materialized(name, tmp_path, assets=None, size=1000.0, **kw):
    item = load_item(name)
    region = center_region(asset_geometry(item, RED[name]), size)
    out = materialize(item, tmp_path, assets or ASSETS[name], region, **kw)
    return item, region, out


# ---------------------------------------------------------------------------------------------------------------------
# the fixtures themselves

def test_every_fixture_is_a_stac_item_with_the_assets_used_here():
    assert set(FIXTURES) == set(ASSETS)
    for name in FIXTURES:
        item = load_item(name)
        assert item["type"] == "Feature" and item["stac_version"].startswith("1.")
        assert set(ASSETS[name]) <= set(item["assets"])


def test_earth_search_item_has_the_boa_flag_and_the_offset_it_already_applied():
    item = load_item("earthsearch_s2_l2a")
    assert item["properties"]["earthsearch:boa_offset_applied"] is True
    assert item["properties"]["s2:processing_baseline"] == "05.09"
    for key in ("red", "nir", "nir08"):
        g = asset_geometry(item, key)
        assert (g.scale, g.offset, g.dtype, g.nodata) == (0.0001, -0.1, "uint16", 0)
    scl = asset_geometry(item, "scl")
    assert (scl.dtype, scl.nodata, scl.scale, scl.offset) == ("uint8", 0, 1.0, 0.0)


def test_earth_search_items_get_no_boa_offset_warning_since_the_files_are_corrected():
    """The +1000 BOA warning is for catalogs that declare no offset (Planetary Computer): Earth Search's files are
    offset-corrected (its flag), so the offset it declares is dropped and nothing is missing."""
    from rasterflow.planning import GridPlan
    from rasterflow.sources import resolve_sources

    item = load_item("earthsearch_s2_l2a")
    g = asset_geometry(item, "red")
    a, _, c, _, e, f = tuple(g.transform)[:6]
    grid = GridPlan(crs=g.crs, resolution=a, bounds=(c, f + e * g.shape[0], c + a * g.shape[1], f), shape=g.shape)
    table = resolve_sources([item], {"red": "red", "nir": "nir"}, grid)
    assert table.warnings == ()
    assert [r.offset for r in table.reads[0]] == [0.0, 0.0]


def test_planetary_computer_items_are_in_two_utm_zones_and_overlap():
    a, b = load_item("pc_s2_l2a_a"), load_item("pc_s2_l2a_b")
    assert asset_geometry(a, "B04").crs == "EPSG:32647" and asset_geometry(b, "B04").crs == "EPSG:32646"
    assert a["properties"]["s2:processing_baseline"] == b["properties"]["s2:processing_baseline"] == "05.10"
    (aw, as_, ae, an), (bw, bs, be, bn) = a["bbox"], b["bbox"]
    assert max(aw, bw) < min(ae, be) and max(as_, bs) < min(an, bn)
    # no raster:bands on PC items: dtype/nodata are the documented defaults, no scale/offset declared
    assert "raster:bands" not in a["assets"]["B04"]
    g = asset_geometry(a, "B04")
    assert (g.dtype, g.nodata, g.scale, g.offset) == ("uint16", 0, 1.0, 0.0)
    assert asset_geometry(a, "SCL").dtype == "uint8"


def test_stac11_item_declares_raster_fields_on_the_asset():
    item = load_item("stac11_raster_v2")
    assert item["stac_version"] == "1.1.0"
    asset = item["assets"]["B04_10m"]
    assert "raster:bands" not in asset and asset["bands"][0]["name"] == "B04"
    g = asset_geometry(item, "B04_10m")
    assert (g.crs, g.dtype, g.nodata, g.scale, g.offset) == ("EPSG:32655", "uint16", 0, 0.0001, -0.1)
    assert g.shape == (10980, 10980) and g.transform == Affine(10, 0, 600000, 0, -10, 7600020)
    assert asset_geometry(item, "AOT_10m").scale == 0.001
    assert asset_geometry(item, "TCI_10m").count == 3


def test_landsat_item_takes_its_grid_from_the_properties():
    item = load_item("landsat_c2_l2")
    assert "proj:shape" not in item["assets"]["red"]
    g = asset_geometry(item, "red")
    assert (g.crs, g.shape, g.dtype, g.nodata, g.scale, g.offset) == ("EPSG:32655", (7971, 7971), "uint16", 0,
                                                                       2.75e-05, -0.2)
    qa = asset_geometry(item, "qa_pixel")
    assert (qa.dtype, qa.nodata, qa.scale) == ("uint16", 1, 1.0)


def test_a_missing_grid_is_derived_from_the_bbox_at_the_documented_resolution():
    item = load_item("landsat_c2_l2")
    del item["properties"]["proj:shape"], item["properties"]["proj:transform"]
    del item["assets"]["red"]["raster:bands"][0]["spatial_resolution"]
    g = asset_geometry(item, "red")
    assert g.crs == "EPSG:32655" and g.transform.a == 30 and g.transform.e == -30
    declared = asset_geometry(load_item("landsat_c2_l2"), "red")
    # the bbox is the footprint's, so the derived grid covers (about) the declared one
    dminx, dminy, dmaxx, dmaxy = declared.bounds
    minx, miny, maxx, maxy = g.bounds
    assert minx <= dminx + 15_000 and maxx >= dmaxx - 15_000 and miny <= dminy + 15_000 and maxy >= dmaxy - 15_000

    s2 = load_item("earthsearch_s2_l2a")
    for key in ("red", "scl", "coastal"):
        del s2["assets"][key]["proj:shape"], s2["assets"][key]["proj:transform"]
        s2["assets"][key].pop("gsd", None)
        s2["assets"][key]["raster:bands"][0].pop("spatial_resolution")
    assert [asset_geometry(s2, k).transform.a for k in ("red", "scl", "coastal")] == [10, 20, 60]


# ---------------------------------------------------------------------------------------------------------------------
# the written files

@pytest.mark.parametrize("name", FIXTURES)
def test_materialized_files_match_the_declared_geometry_and_values(name, tmp_path):
    item, region, out = _materialized(name, tmp_path)
    for key in ASSETS[name]:
        g = asset_geometry(item, key)
        href = out["assets"][key]["href"]
        assert href == str(tmp_path.resolve() / f"{item['id']}_{key}.tif")
        assert item["assets"][key]["href"] != href  # the input item is not modified
        with rasterio.open(href) as src:
            assert src.crs == CRS.from_user_input(g.crs)
            assert src.transform == g.transform
            assert src.shape == g.shape and src.count == g.count
            assert src.dtypes[0] == g.dtype
            assert src.nodata == g.nodata
            assert src.profile["tiled"] and src.compression is not None
            assert src.block_shapes[0] == ((512, 512) if max(g.shape) >= 2048 else (256, 256))
            win, expected = expected_pixels(item, key, region)
            got = src.read(window=win)
            np.testing.assert_array_equal(got, expected)
            if g.nodata is not None:
                assert (got != g.nodata).mean() > 0.9  # mostly data
            # a block far from the region was never written: it reads as nodata (or 0 without one)
            corner = src.read(1, window=Window(0, 0, 256, 256))
            assert (corner == (g.nodata if g.nodata is not None else 0)).all()
        assert (tmp_path / f"{item['id']}_{key}.tif").stat().st_size < 2_000_000
    untouched = set(item["assets"]) - set(ASSETS[name])
    assert all(out["assets"][k] == item["assets"][k] for k in untouched)


def test_region_window_snaps_outward_and_stays_inside_the_grid():
    g = asset_geometry(load_item("earthsearch_s2_l2a"), "red")
    minx, miny, maxx, maxy = g.bounds
    assert region_window(g, (minx + 5, maxy - 25, minx + 21, maxy - 5)) == Window(0, 0, 3, 3)
    assert region_window(g, (minx - 1e6, miny - 1e6, maxx + 1e6, maxy + 1e6)) == Window(0, 0, 10980, 10980)
    with pytest.raises(ValueError):
        region_window(g, (maxx + 10, maxy + 10, maxx + 20, maxy + 20))


@pytest.mark.parametrize("name", ["earthsearch_s2_l2a", "pc_s2_l2a_a", "stac11_raster_v2"])
def test_sentinel2_values_are_plausible_and_scl_zero_also_covers_valid_reflectance(name, tmp_path):
    item, region, out = _materialized(name, tmp_path, assets=(RED[name], MASK[name]), size=3000.0)
    red_g = asset_geometry(item, RED[name])
    with rasterio.open(out["assets"][RED[name]]["href"]) as src:
        win = region_window(red_g, region)
        red = src.read(1, window=win)
    valid = red != 0
    assert red[valid].min() >= 1000 and red[valid].max() <= 6000
    assert 0.002 < (~valid).mean() < 0.03

    scl_g = asset_geometry(item, MASK[name])
    with rasterio.open(out["assets"][MASK[name]]["href"]) as src:
        swin = region_window(scl_g, region)
        scl = src.read(1, window=swin)
    assert set(np.unique(scl)) <= set(range(12)) and len(np.unique(scl)) >= 10
    # sample the reflectance at each SCL pixel centre (the 20 m pixel holds 2×2 10 m pixels; take one)
    t = scl_g.transform
    xs = t.c + (np.arange(swin.col_off, swin.col_off + swin.width) + 0.5) * t.a
    ys = t.f + (np.arange(swin.row_off, swin.row_off + swin.height) + 0.5) * t.e
    cols = np.floor((xs - red_g.transform.c) / red_g.transform.a).astype(int) - win.col_off
    rows = np.floor((ys - red_g.transform.f) / red_g.transform.e).astype(int) - win.row_off
    inside_c, inside_r = (cols >= 0) & (cols < red.shape[1]), (rows >= 0) & (rows < red.shape[0])
    red_at = red[np.ix_(rows[inside_r], cols[inside_c])]
    scl_in = scl[np.ix_(inside_r, inside_c)]
    assert (scl_in[red_at == 0] == 0).all()  # no reflectance -> SCL says no data
    deliberate = (scl_in == 0) & (red_at != 0)  # SCL 0 over valid reflectance, on purpose
    assert 0.005 < deliberate.mean() < 0.03


def test_landsat_qa_pixel_flags_cloud_and_shadow_and_fills_where_sr_is_nodata(tmp_path):
    item, region, out = _materialized("landsat_c2_l2", tmp_path, assets=("red", "qa_pixel"), size=6000.0)
    g = asset_geometry(item, "red")
    win = region_window(g, region)
    with rasterio.open(out["assets"]["red"]["href"]) as src:
        red = src.read(1, window=win)
    with rasterio.open(out["assets"]["qa_pixel"]["href"]) as src:
        qa = src.read(1, window=win)
        assert src.nodata == 1
    valid = red != 0
    assert red[valid].min() >= 7273 and red[valid].max() <= 43636
    np.testing.assert_array_equal(qa == 1, ~valid)  # fill exactly where the surface reflectance has none
    cloud, shadow = (qa & (1 << 3)) != 0, (qa & (1 << 4)) != 0
    assert 0.08 < cloud[valid].mean() < 0.16 and 0.05 < shadow[valid].mean() < 0.11
    assert 0.15 < (cloud | shadow)[valid].mean() < 0.25


def test_materialize_is_deterministic_and_the_seed_changes_values(tmp_path):
    item = load_item("pc_s2_l2a_b")
    region = center_region(asset_geometry(item, "B04"))
    a = materialize(item, tmp_path / "a", ["B04"], region)
    b = materialize(item, tmp_path / "b", ["B04"], region)
    c = materialize(item, tmp_path / "c", ["B04"], region, seed=1)
    win = region_window(asset_geometry(item, "B04"), region)
    read = []
    for x in (a, b, c):
        with rasterio.open(x["assets"]["B04"]["href"]) as src:
            read.append(src.read(1, window=win))
    np.testing.assert_array_equal(read[0], read[1])
    assert (read[0] != read[2]).any()


def test_dtype_override_writes_a_mistyped_file(tmp_path):
    item = load_item("earthsearch_s2_l2a")
    region = center_region(asset_geometry(item, "red"))
    out = materialize(item, tmp_path, ["red", "nir"], region, dtype_override={"red": "float32"})
    with rasterio.open(out["assets"]["red"]["href"]) as src:
        assert src.dtypes[0] == "float32" and src.nodata == 0
        win, expected = expected_pixels(item, "red", region, dtype_override={"red": "float32"})
        np.testing.assert_array_equal(src.read(window=win), expected)
    with rasterio.open(out["assets"]["nir"]["href"]) as src:
        assert src.dtypes[0] == "uint16"
    out = materialize(item, tmp_path / "i8", ["scl"], region, dtype_override={"scl": "int8"})
    with rasterio.open(out["assets"]["scl"]["href"]) as src:
        assert src.dtypes[0] == "int8" and src.nodata == 0


def test_truncated_file_fails_to_read(tmp_path):
    item, region, out = _materialized("earthsearch_s2_l2a", tmp_path, assets=("red",))
    path = tmp_path / "red.tif"
    shutil.copy(out["assets"]["red"]["href"], path)
    size = path.stat().st_size
    truncate(path)
    assert path.stat().st_size == size // 2
    win, _ = expected_pixels(item, "red", region)
    with pytest.raises(RasterioIOError), rasterio.open(path) as src:
        src.read(window=win)


def test_writing_a_full_size_sparse_band_is_fast(tmp_path):
    item = load_item("stac11_raster_v2")
    region = center_region(asset_geometry(item, "B04_10m"), 2000.0)
    t0 = time.perf_counter()
    materialize(item, tmp_path, ["B04_10m", "B08_10m", "SCL_20m"], region)
    assert time.perf_counter() - t0 < 2.0


# --- rasterflow's metadata rules on the real documents ---------------------------------------------------------


def _resolve(name: str, assets: dict[str, str]):
    from rasterflow.planning import GridPlan
    from rasterflow.sources import resolve_sources

    grid = GridPlan(crs="EPSG:32633", resolution=10.0, bounds=(0.0, 0.0, 100.0, 100.0), shape=(10, 10))
    return resolve_sources([load_item(name)], assets, grid)


def test_real_earth_search_item_offset_is_not_applied_twice():
    table = _resolve("earthsearch_s2_l2a", {"red": "red", "scl": "scl"})
    red, scl = table.reads[0]
    assert (red.data_type, red.nodata, red.scale, red.offset) == ("uint16", 0.0, 0.0001, 0.0)
    assert scl.data_type == "uint8" and table.assets[1].load_dtype == "uint8"
    assert any("earthsearch:boa_offset_applied" in line for line in table.assets[0].applied)


def test_real_cdse_stac11_item_raster_v2_fields_are_read():
    item = load_item("stac11_raster_v2")
    key = next(k for k, a in item["assets"].items() if a.get("raster:offset") == -0.1)
    read = _resolve("stac11_raster_v2", {"red": key}).reads[0][0]
    assert (read.data_type, read.nodata, read.scale, read.offset) == ("uint16", 0.0, 0.0001, -0.1)
    assert read.crs == "EPSG:32655" and read.shape is not None


def test_real_landsat_item_scale_offset_and_qa_nodata():
    table = _resolve("landsat_c2_l2", {"red": "red", "qa": "qa_pixel"})
    red, qa = table.reads[0]
    assert (red.scale, red.offset, red.nodata) == (2.75e-05, -0.2, 0.0)
    assert (qa.data_type, qa.nodata, table.assets[1].kind) == ("uint16", 1.0, "int")
    assert red.shape == (7971, 7971)  # proj:shape from the item properties


def test_real_pc_items_are_in_two_utm_zones():
    crs = {_resolve(name, {"red": "B04"}).reads[0][0].crs for name in ("pc_s2_l2a_a", "pc_s2_l2a_b")}
    assert crs == {"EPSG:32647", "EPSG:32646"}
