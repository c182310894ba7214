"""Tests of rasterflow.sample: synthetic Sentinel-2 L2A-like COGs + STAC items, generated from a seed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
pystac = pytest.importorskip("pystac")

from rasterflow.sample import (  # noqa: E402
    ASSETS,
    COLLECTION_ID,
    SampleCatalog,
    generate_sample,
    main,
)

SIZE, N_DATES, BLOCK = 256, 4, 128
PARAMS = {"size": SIZE, "n_dates": N_DATES, "blocksize": BLOCK}
CLOUD = (8, 9, 10)
REFLECTANCE = ("red", "green", "nir", "swir16")


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> SampleCatalog:
    return generate_sample(tmp_path_factory.mktemp("sample"), **PARAMS)


@pytest.fixture(scope="module")
def items(sample) -> list[dict]:
    return json.loads(sample.items_json.read_text())["features"]


@pytest.fixture(scope="module")
def pixels(items) -> list[dict[str, np.ndarray]]:
    """Every asset of every item, read back with rasterio (date order)."""
    out = []
    for item in items:
        arrays = {}
        for key, asset in item["assets"].items():
            with rasterio.open(asset["href"]) as ds:
                arrays[key] = ds.read(1)
        out.append(arrays)
    return out


def _reflectance(dn: np.ndarray, asset: dict) -> np.ndarray:
    band = asset["raster:bands"][0]
    return dn.astype(np.float64) * band["scale"] + band["offset"]


def _ndvi(item: dict, px: dict) -> np.ndarray:
    red = _reflectance(px["red"], item["assets"]["red"])
    nir = _reflectance(px["nir"], item["assets"]["nir"])
    with np.errstate(divide="ignore", invalid="ignore"):
        return (nir - red) / (nir + red)


def _digest(catalog: SampleCatalog) -> str:
    h = hashlib.sha256()
    for item in catalog.items():
        for key in sorted(item["assets"]):
            with rasterio.open(item["assets"][key]["href"]) as ds:
                h.update(key.encode())
                h.update(ds.read(1).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# Layout and files
# ----------------------------------------------------------------------------------------------------------------


def test_catalog_fields(sample):
    assert sample.directory.is_absolute() and sample.directory.is_dir()
    assert sample.items_json == sample.directory / "items.json"
    assert sample.items_ndjson == sample.directory / "items.ndjson"
    assert sample.collection_json == sample.directory / "collection.json"
    assert (sample.directory / "sample.json").is_file()
    assert len(sample.item_ids) == N_DATES and len(set(sample.item_ids)) == N_DATES
    assert sample.item_ids[0] == "S2A_33UUU_20240603_0_L2A"
    assert sample.crs == "EPSG:32633"
    assert sample.bounds == (380000.0, 5830000.0 - SIZE * 10, 380000.0 + SIZE * 10, 5830000.0)
    west, south, east, north = sample.bbox_wgs84
    assert 13.1 < west < east < 13.5 and 52.4 < south < north < 52.7  # next to Berlin
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.crs = "EPSG:4326"  # type: ignore[misc]


def test_every_asset_is_a_valid_cog(sample, items):
    from rio_cogeo.cogeo import cog_validate

    for item in items:
        assert set(item["assets"]) == set(ASSETS)
        for key, asset in item["assets"].items():
            path = Path(asset["href"])
            assert path.is_absolute() and path.is_file()
            assert path == sample.directory / item["id"] / f"{key}.tif"
            assert cog_validate(str(path), strict=True) == (True, [], [])
            with rasterio.open(path) as ds:
                assert ds.driver == "GTiff" and ds.count == 1
                assert ds.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
                assert ds.tags(ns="IMAGE_STRUCTURE").get("COMPRESSION") == "ZSTD"
                assert ds.block_shapes == [(BLOCK, BLOCK)]
                assert ds.overviews(1), "no internal overviews"
                assert ds.dtypes[0] == ("uint8" if key == "scl" else "uint16")
                assert ds.dtypes[0] == asset["raster:bands"][0]["data_type"]
                assert ds.nodata == 0
                assert ds.crs.to_epsg() == 32633
                assert list(ds.shape) == asset["proj:shape"] == item["properties"]["proj:shape"] == [SIZE, SIZE]
                assert tuple(ds.transform)[:6] == tuple(asset["proj:transform"])
                assert tuple(ds.transform)[:6] == tuple(item["properties"]["proj:transform"])
                assert list(ds.bounds) == item["properties"]["proj:bbox"]


# ----------------------------------------------------------------------------------------------------------------
# STAC metadata
# ----------------------------------------------------------------------------------------------------------------


def test_items_are_stac(items):
    for i, d in enumerate(items):
        assert d["stac_version"] == "1.0.0" and d["type"] == "Feature"
        assert d["collection"] == COLLECTION_ID
        assert any(link["rel"] == "collection" for link in d["links"])
        exts = " ".join(d["stac_extensions"])
        assert "/projection/v1." in exts and "/raster/v1." in exts and "/eo/v1." in exts
        props = d["properties"]
        # stackstac 0.5.1 reads only proj:epsg, which pystac would migrate away: the files must keep it
        assert props["proj:epsg"] == 32633 and props["proj:code"] == "EPSG:32633"
        assert all(a["proj:epsg"] == 32633 for a in d["assets"].values())
        assert props["datetime"].endswith("T10:05:00Z")
        assert props["platform"] == ("sentinel-2a" if i % 2 == 0 else "sentinel-2b")
        assert props["s2:mgrs_tile"] == "33UUU"
        assert 0 <= props["eo:cloud_cover"] <= 100
        for key in REFLECTANCE:
            band = d["assets"][key]["raster:bands"][0]
            assert band == {**band, "scale": 0.0001, "offset": -0.1, "nodata": 0, "data_type": "uint16"}
            assert d["assets"][key]["eo:bands"][0]["common_name"] == key
        assert d["assets"]["scl"]["raster:bands"][0] == {**d["assets"]["scl"]["raster:bands"][0],
                                                        "nodata": 0, "data_type": "uint8"}
        for asset in d["assets"].values():
            assert asset["type"] == "image/tiff; application=geotiff; profile=cloud-optimized"
            assert asset["roles"] == ["data"]

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. pystac's "conflicting proj:code / proj:epsg" warning
            item = pystac.Item.from_dict(json.loads(json.dumps(d)))
        assert item.id == d["id"]
        assert item.datetime is not None and item.datetime.tzinfo is not None
        assert item.properties["proj:code"] == "EPSG:32633"
        west, south, east, north = d["bbox"]
        ring = np.array(d["geometry"]["coordinates"][0])
        assert (ring[0] == ring[-1]).all()
        assert ring[:, 0].min() >= west and ring[:, 0].max() <= east
        assert ring[:, 1].min() >= south and ring[:, 1].max() <= north


def test_collection_is_stac_and_covers_items(sample, items):
    d = json.loads(sample.collection_json.read_text())
    assert d["type"] == "Collection" and d["id"] == COLLECTION_ID and d["stac_version"] == "1.0.0"
    exts = " ".join(d["stac_extensions"])
    assert "/projection/v1." in exts and "/raster/v1." in exts and "/eo/v1." in exts
    collection = pystac.Collection.from_dict(d)
    assert collection.license
    [[west, south, east, north]] = d["extent"]["spatial"]["bbox"]
    assert [west, south, east, north] == list(sample.bbox_wgs84)
    [[start, end]] = d["extent"]["temporal"]["interval"]
    for item in items:
        w, s, e, n = item["bbox"]
        assert west <= w and south <= s and e <= east and n <= north
        assert start <= item["properties"]["datetime"] <= end
    assert start == items[0]["properties"]["datetime"] and end == items[-1]["properties"]["datetime"]


def test_items_json_and_ndjson_hold_the_same_items(sample, items):
    lines = [line for line in sample.items_ndjson.read_text().splitlines() if line.strip()]
    assert [json.loads(line) for line in lines] == items == sample.items()
    assert [i["id"] for i in items] == list(sample.item_ids)
    collection = pystac.ItemCollection.from_file(str(sample.items_json))
    assert [i.id for i in collection] == list(sample.item_ids)


def test_bbox_wgs84_contains_every_item(sample, items):
    west, south, east, north = sample.bbox_wgs84
    for item in items:
        w, s, e, n = item["bbox"]
        assert west <= w < e <= east and south <= s < n <= north


# ----------------------------------------------------------------------------------------------------------------
# Pixel content
# ----------------------------------------------------------------------------------------------------------------


def test_cloud_cover_is_the_share_of_cloudy_valid_pixels(items, pixels):
    """eo:cloud_cover = % of *valid* pixels (SCL != 0) that are SCL 8, 9 or 10."""
    for item, px in zip(items, pixels):
        scl = px["scl"]
        valid = scl != 0
        expected = 100.0 * np.isin(scl, CLOUD).sum() / valid.sum()
        assert item["properties"]["eo:cloud_cover"] == pytest.approx(expected, abs=0.006)
        nodata = 100.0 * (~valid).sum() / scl.size
        assert item["properties"]["s2:nodata_pixel_percentage"] == pytest.approx(nodata, abs=0.006)


def test_cloud_cover_varies_across_the_threshold(items):
    covers = [i["properties"]["eo:cloud_cover"] for i in items]
    assert any(c > 40 for c in covers), covers
    assert any(c < 40 for c in covers), covers
    assert sum(c < 40 for c in covers) > len(covers) / 2, covers  # most dates are usable


def test_scene_has_all_classes(pixels):
    seen = set(np.unique(np.concatenate([px["scl"].ravel() for px in pixels])).tolist())
    assert {0, 3, 4, 5, 6, 8, 9} <= seen <= {0, 3, 4, 5, 6, 8, 9, 10}


def test_reflectances_are_plausible(items, pixels):
    for item, px in zip(items, pixels):
        scl = px["scl"]
        refl = {k: _reflectance(px[k], item["assets"][k]) for k in REFLECTANCE}
        ndvi = _ndvi(item, px)
        if (scl == 4).any():  # vegetation (SCL 4 means NDVI > 0.4)
            assert np.median(ndvi[scl == 4]) > 0.45
        if (scl == 6).any():  # water: nir below red
            assert np.median(ndvi[scl == 6]) < 0.0
        if (scl == 3).sum() and (scl == 5).sum():  # shadows are dark, clouds bright in every band
            assert np.median(refl["nir"][scl == 3]) < 0.5 * np.median(refl["nir"][np.isin(scl, (4, 5))])
        cloudy = np.isin(scl, (8, 9))
        if cloudy.sum():
            for k in ("red", "green", "nir"):
                assert np.median(refl[k][cloudy]) > 0.3
        for k in REFLECTANCE:  # nodata iff SCL says so
            assert ((px[k] == 0) == (scl == 0)).all()


def test_ndvi_rises_then_falls(items, pixels):
    """The seasonal signal: mean NDVI change between consecutive dates over pixels that are clear vegetation
    (SCL 4) on both dates (paired, so clouds moving over different land covers cannot fake a trend)."""
    changes = []
    for (a, pa), (b, pb) in zip(zip(items, pixels), zip(items[1:], pixels[1:])):
        both = (pa["scl"] == 4) & (pb["scl"] == 4)
        assert both.sum() > 100
        changes.append(float(np.mean(_ndvi(b, pb)[both] - _ndvi(a, pa)[both])))
    signs = [c > 0 for c in changes]
    assert signs[0] and not signs[-1], changes
    assert signs == sorted(signs, reverse=True), changes  # rises, then only falls
    assert max(changes) > 0.05 and min(changes) < -0.05, changes


def test_clouds_move_between_dates(pixels):
    masks = [np.isin(px["scl"], CLOUD) for px in pixels]
    for a, b in zip(masks, masks[1:]):
        assert (a ^ b).sum() > 0.25 * (a | b).sum()  # a good part of the clouds is elsewhere


def test_shadows_lie_north_west_of_clouds(pixels):
    """The sun is in the south-south-east: looking south-east of a shadow pixel finds its cloud far more often
    than looking north-west."""
    step = SIZE // 20
    for px in pixels:
        scl = px["scl"]
        cloud, shadow = np.isin(scl, (8, 9)), scl == 3
        if shadow.sum() < 100:
            continue
        to_south_east = cloud[step:, step:][shadow[:-step, :-step]].mean()
        to_north_west = cloud[:-step, :-step][shadow[step:, step:]].mean()
        assert to_south_east > 0.5 and to_south_east > 2 * to_north_west, (to_south_east, to_north_west)


def test_swath_edge_nodata_on_some_dates(items, pixels):
    cut = [px["scl"][:, 0].min() == 0 for px in pixels]
    assert any(cut) and not all(cut)
    for item, px, has_cut in zip(items, pixels, cut):
        nodata = px["scl"] == 0
        if not has_cut:
            assert not nodata.any()
            continue
        assert nodata[:, 0].all() and not nodata[:, -1].any()  # a diagonal cut on the west side
        assert not nodata[0, : SIZE // 4].all() or nodata[-1, : SIZE // 4].sum() < nodata[0, : SIZE // 4].sum()
        rows_cut = nodata.sum(axis=1)
        assert rows_cut[0] > rows_cut[-1] > 0  # diagonal
        for k in REFLECTANCE:
            assert (px[k][nodata] == 0).all()
        # the geometry is the valid-data footprint: smaller than the tile's
        full = next(i for i, c in zip(items, cut) if not c)
        assert item["bbox"][0] > full["bbox"][0]


def test_stackstac_reads_the_items_on_their_own_grid(sample, items, pixels):
    """The consumer's view: stackstac 0.5.1 on the item dicts (proj:epsg kept) lands on the tile grid exactly."""
    stackstac = pytest.importorskip("stackstac")
    da = stackstac.stack(items, assets=["red", "scl"], dtype="float32", rescale=False, fill_value=np.float32(np.nan))
    assert da.shape == (N_DATES, 2, SIZE, SIZE)
    assert tuple(da.attrs["transform"])[:6] == tuple(items[0]["properties"]["proj:transform"])
    assert str(da.attrs["crs"]).lower() == "epsg:32633"
    for t, px in enumerate(pixels):
        expected = px["red"].astype(np.float32)
        expected[px["red"] == 0] = np.nan  # nodata 0 -> fill value
        assert np.array_equal(da.isel(time=t).sel(band="red").values, expected, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------
# Determinism, reuse, layout
# ----------------------------------------------------------------------------------------------------------------


def test_deterministic(sample, tmp_path):
    again = generate_sample(tmp_path / "again", **PARAMS)
    assert _digest(again) == _digest(sample)
    other = generate_sample(tmp_path / "other", **PARAMS, seed=1)
    assert _digest(other) != _digest(sample)


def test_reuses_a_complete_sample(tmp_path):
    kwargs = {"size": 64, "n_dates": 3, "blocksize": 32}
    first = generate_sample(tmp_path / "s", **kwargs)
    files = sorted((tmp_path / "s").rglob("*"))
    # every file but the lock file, which filelock truncates (to empty, as it was) on each acquire
    mtimes = {p: p.stat().st_mtime_ns for p in files if p.name != ".sample.lock"}
    t0 = time.perf_counter()
    second = generate_sample(tmp_path / "s", **kwargs)
    assert time.perf_counter() - t0 < 0.5
    assert second == first
    assert sorted((tmp_path / "s").rglob("*")) == files
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes

    # overwrite=True regenerates (same content)
    time.sleep(0.01)
    third = generate_sample(tmp_path / "s", **kwargs, overwrite=True)
    assert third == first
    tif = tmp_path / "s" / first.item_ids[0] / "red.tif"
    assert tif.stat().st_mtime_ns > mtimes[tif]

    # other parameters replace the previous sample; its item directories go
    fourth = generate_sample(tmp_path / "s", **{**kwargs, "n_dates": 2, "start": "2024-07-01"})
    assert len(fourth.item_ids) == 2 and not set(fourth.item_ids) & set(first.item_ids)
    assert not any((tmp_path / "s" / i).exists() for i in first.item_ids)
    manifest = json.loads((tmp_path / "s" / "sample.json").read_text())
    assert manifest["params"]["n_dates"] == 2 and manifest["item_ids"] == list(fourth.item_ids)


def test_incomplete_sample_is_regenerated(tmp_path):
    kwargs = {"size": 32, "n_dates": 2, "blocksize": 16}
    first = generate_sample(tmp_path / "s", **kwargs)
    (tmp_path / "s" / first.item_ids[1] / "nir.tif").unlink()
    second = generate_sample(tmp_path / "s", **kwargs)
    assert second == first
    assert (tmp_path / "s" / first.item_ids[1] / "nir.tif").is_file()


def test_multi_tile_layout(tmp_path):
    size = 64
    cat = generate_sample(tmp_path / "tiles", size=size, n_dates=2, tiles=(1, 2), blocksize=32)
    items = cat.items()
    assert len(items) == 4 and len(set(cat.item_ids)) == 4
    extent = size * 10.0
    assert cat.bounds == (380000.0, 5830000.0 - extent, 380000.0 + 2 * extent, 5830000.0)
    by_date: dict[str, list[dict]] = {}
    for item in items:
        by_date.setdefault(item["properties"]["datetime"], []).append(item)
    for pair in by_date.values():
        left, right = sorted(pair, key=lambda i: i["properties"]["proj:bbox"][0])
        lb, rb = left["properties"]["proj:bbox"], right["properties"]["proj:bbox"]
        assert lb[2] == rb[0]  # adjacent, no gap, no overlap
        assert lb[1] == rb[1] and lb[3] == rb[3]
        assert lb[2] - lb[0] == rb[2] - rb[0] == extent
        with rasterio.open(left["assets"]["scl"]["href"]) as a, rasterio.open(right["assets"]["scl"]["href"]) as b:
            assert a.bounds.right == b.bounds.left
            assert a.transform.c + size * a.transform.a == b.transform.c
        assert left["bbox"][2] <= right["bbox"][2] and left["bbox"][0] < right["bbox"][0]
    west, south, east, north = cat.bbox_wgs84
    for item in items:
        w, s, e, n = item["bbox"]
        assert west <= w and south <= s and e <= east and n <= north


def test_concurrent_calls_on_one_directory_are_serialised(tmp_path):
    """A generation waits while another process holds the directory's lock (``.sample.lock``, filelock), and two
    threads generating into one directory then both get the one complete sample."""
    import threading

    kwargs = {"size": 32, "n_dates": 2, "blocksize": 16}
    d = tmp_path / "s"
    d.mkdir()
    hold = ("import sys, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
            "sys.stdin.readline()")
    results: list[SampleCatalog] = []
    with subprocess.Popen([sys.executable, "-c", hold, str(d / ".sample.lock")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        threads = [threading.Thread(target=lambda: results.append(generate_sample(d, **kwargs))) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert not results and not (d / "sample.json").exists()  # both wait for the lock
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 2 and results[0] == results[1]
    assert generate_sample(d, **kwargs) == results[0]  # complete: reused


def test_rejects_bad_parameters(tmp_path):
    for kwargs in ({"blocksize": 100}, {"size": 0}, {"n_dates": 0}, {"tiles": (0, 1)}, {"start": "June"},
                   {"every_days": 0}):
        with pytest.raises(ValueError):
            generate_sample(tmp_path / "bad", **kwargs)


def test_module_import_is_light():
    code = "import sys, rasterflow.sample; print('rasterio' in sys.modules, 'pyproj' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_main_entry_point(tmp_path, capsys):
    assert main([str(tmp_path / "cli"), "--size", "32", "--dates", "2", "--blocksize", "16"]) == 0
    assert "2 items" in capsys.readouterr().out
    assert (tmp_path / "cli" / "sample.json").is_file()


def test_a_chosen_codec_is_written_and_keeps_the_pixels(sample, tmp_path):
    """``compress="DEFLATE"`` (what public Sentinel-2 COGs use) writes DEFLATE COGs with the same pixels as the
    default codec; the choice is part of the manifest, so a ZSTD sample in the same directory is replaced."""
    import rasterio

    deflate = generate_sample(tmp_path / "d", **PARAMS, compress="deflate")
    for item_id in deflate.item_ids[:2]:
        for asset in ("red", "scl"):
            with rasterio.open(tmp_path / "d" / item_id / f"{asset}.tif") as src, \
                    rasterio.open(Path(sample.directory) / item_id / f"{asset}.tif") as default:
                assert src.compression.name.upper() == "DEFLATE"
                assert default.compression.name.upper() != "DEFLATE"
                np.testing.assert_array_equal(src.read(1), default.read(1))
    again = generate_sample(tmp_path / "d", **PARAMS)  # the default codec: not the DEFLATE sample
    with rasterio.open(tmp_path / "d" / again.item_ids[0] / "red.tif") as src:
        assert src.compression.name.upper() != "DEFLATE"
