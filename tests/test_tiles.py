"""Local tiled GeoTIFFs decoded tile by tile (rasterflow.read.tiles) give exactly what GDAL reads, for every codec,
predictor, data type and byte order the path takes; what it does not take is left to GDAL.

The reference is rasterio's own read of the same window of the same file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin
from rasterio.windows import Window

from rasterflow.read import tiles

HEIGHT, WIDTH, TILE = 300, 520, 128  # edge tiles on both axes


def _values(dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "float32":
        values = rng.normal(0.3, 0.2, (HEIGHT, WIDTH)).astype(np.float32)
        values[rng.random((HEIGHT, WIDTH)) < 0.05] = np.nan
        return values
    info = np.iinfo(dtype)
    # smooth plus noise, so predictors and codecs have something to do, with the extremes present
    base = np.add.outer(np.arange(HEIGHT), np.arange(WIDTH)) * 7 + rng.integers(0, 50, (HEIGHT, WIDTH))
    values = (base % (int(info.max) - int(info.min) + 1) + int(info.min)).astype(dtype)
    values[0, :3] = [info.min, info.max, 0]
    return values


def _write(path: Path, values: np.ndarray, **options) -> Path:
    profile = dict(driver="GTiff", width=WIDTH, height=HEIGHT, count=1, dtype=values.dtype, crs="EPSG:32633",
                   transform=from_origin(500000, 6000000, 10, 10), tiled=True, blockxsize=TILE, blockysize=TILE)
    profile.update(options)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(values, 1)
    return path


def _index(path: Path) -> tiles.TileIndex | None:
    with rasterio.open(path) as src:
        return tiles.tile_index(str(path), band_count=src.count, dtype=np.dtype(src.dtypes[0]), shape=src.shape,
                                block_shape=tuple(src.block_shapes[0]))


WINDOWS = [(0, 0, HEIGHT, WIDTH), (0, 0, TILE, TILE), (128, 256, 128, 128), (5, 7, 1, 1), (100, 120, 57, 301),
           (HEIGHT - 44, WIDTH - 8, 44, 8), (127, 127, 2, 2), (250, 0, 50, WIDTH)]


CASES = [
    ("uint16", "ZSTD", 2, "LITTLE"), ("uint16", "ZSTD", 1, "LITTLE"), ("uint16", "DEFLATE", 2, "LITTLE"),
    ("uint16", "LZW", 2, "LITTLE"), ("uint16", "NONE", 1, "LITTLE"), ("uint8", "ZSTD", 2, "LITTLE"),
    ("uint8", "DEFLATE", 1, "LITTLE"), ("int16", "ZSTD", 2, "LITTLE"), ("float32", "ZSTD", 3, "LITTLE"),
    ("float32", "DEFLATE", 3, "LITTLE"), ("float32", "LZW", 1, "LITTLE"), ("uint16", "ZSTD", 2, "BIG"),
    ("float32", "DEFLATE", 3, "BIG"), ("int16", "NONE", 1, "BIG"),
]


@pytest.fixture(params=["compiled", "imagecodecs"])
def predictor_engine(request):
    """16-bit predicted tiles: undone by the compiled kernel, or by imagecodecs through tifffile."""
    from rasterflow import compiled

    if request.param == "compiled" and not compiled.available():
        pytest.skip("the compiled kernels are not built here")
    compiled.set_enabled(request.param == "compiled")
    yield request.param
    compiled.set_enabled(True)


@pytest.mark.parametrize("dtype, codec, predictor, endianness", CASES)
def test_every_window_is_what_gdal_reads(tmp_path, dtype, codec, predictor, endianness, predictor_engine):
    values = _values(dtype, np.random.default_rng(len(dtype) + predictor))
    options = dict(compress=codec, endianness=endianness)
    if codec != "NONE":
        options["predictor"] = predictor
    path = _write(tmp_path / "src.tif", values, **options)
    index = _index(path)
    assert index is not None, "the path must take this file"
    fast = (predictor_engine == "compiled" and predictor == 2 and dtype in ("uint16", "int16")
            and codec in ("ZSTD", "DEFLATE") and endianness == "LITTLE")
    assert (index.predicted is not None) == fast
    with rasterio.open(path) as src:
        for row, col, height, width in WINDOWS:
            expected = src.read(1, window=Window(col, row, width, height))
            got = np.full((height, width), 99, dtype=dtype)
            assert tiles.read_window(index, row, col, got)
            np.testing.assert_array_equal(got, expected)  # NaN where NaN, every bit of the rest
            assert got.tobytes() == expected.tobytes()
    # into a strided view of a larger plane, as the reader writes into a task's plane
    plane = np.zeros((HEIGHT + 10, WIDTH + 10), dtype=dtype)
    assert tiles.read_window(index, 3, 5, plane[2:102, 4:204])
    assert plane[2:102, 4:204].tobytes() == values[3:103, 5:205].tobytes()
    assert not plane[:2].any() and not plane[102:].any() and not plane[:, :4].any() and not plane[:, 204:].any()


@pytest.mark.parametrize("options, why", [
    (dict(tiled=False), "strips"),
    (dict(compress="JPEG", dtype="uint8"), "lossy codec"),
    (dict(count=2), "two bands"),
])
def test_files_the_path_does_not_take_are_left_to_gdal(tmp_path, options, why):
    dtype = options.get("dtype", "uint16")
    values = _values(dtype, np.random.default_rng(1))
    path = tmp_path / "src.tif"
    write_options = {k: v for k, v in options.items() if k != "dtype"}
    if write_options.get("count") == 2:
        profile = dict(driver="GTiff", width=WIDTH, height=HEIGHT, count=2, dtype=dtype, crs="EPSG:32633",
                       transform=from_origin(500000, 6000000, 10, 10), tiled=True, blockxsize=TILE, blockysize=TILE)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(np.stack([values, values]))
    else:
        _write(path, values.astype(dtype), **write_options)
    assert _index(path) is None, why


def test_the_environment_switch_sends_reads_to_gdal(tmp_path, monkeypatch):
    path = _write(tmp_path / "src.tif", _values("uint16", np.random.default_rng(2)), compress="ZSTD", predictor=2)
    assert _index(path) is not None
    monkeypatch.setenv(tiles.ENV_SWITCH, "gdal")
    assert not tiles.decoder_available()
    assert _index(path) is None


def test_a_sparse_tile_is_left_to_gdal(tmp_path):
    values = _values("uint16", np.random.default_rng(3))
    path = tmp_path / "sparse.tif"
    profile = dict(driver="GTiff", width=WIDTH, height=HEIGHT, count=1, dtype="uint16", crs="EPSG:32633",
                   transform=from_origin(500000, 6000000, 10, 10), tiled=True, blockxsize=TILE, blockysize=TILE,
                   compress="ZSTD", nodata=0, sparse_ok=True)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(values[:TILE, :TILE], 1, window=Window(0, 0, TILE, TILE))  # one tile written, the rest absent
    index = _index(path)
    assert index is not None and index.byte_counts[1] == 0
    got = np.full((TILE, TILE), 7, dtype=np.uint16)
    assert not tiles.read_window(index, 0, TILE, got)
    assert (got == 7).all(), "a window the path cannot read is left untouched"
    first = np.zeros((TILE, TILE), dtype=np.uint16)
    assert tiles.read_window(index, 0, 0, first)
    np.testing.assert_array_equal(first, values[:TILE, :TILE])


def test_a_truncated_file_raises_naming_the_tile(tmp_path):
    path = _write(tmp_path / "src.tif", _values("uint16", np.random.default_rng(4)), compress="ZSTD", predictor=2)
    index = _index(path)
    assert index is not None
    last = len(index.offsets) - 1
    os.truncate(path, index.offsets[last] + index.byte_counts[last] // 2)
    with pytest.raises(OSError, match=f"tile {last} of .*truncated"):
        tiles.read_window(index, HEIGHT - 1, WIDTH - 1, np.zeros((1, 1), np.uint16))


def test_the_reader_uses_the_path_and_reads_what_gdal_reads(sample, tmp_path, monkeypatch):
    """A task's planes read through the tiles and through GDAL alone are the same, bit for bit."""
    from rasterflow.read import datasets, read_planes

    from reference import load_items

    path = load_items(sample)[0]["assets"]["red"]["href"]
    with rasterio.open(path) as src:
        index = tiles.tile_index(path, band_count=src.count, dtype=np.dtype(src.dtypes[0]), shape=src.shape,
                                 block_shape=tuple(src.block_shapes[0]))
    assert index is not None, "the samples are local tiled ZSTD COGs: the path must take them"
    job = _sample_job(sample, tmp_path)
    import rasterflow.read as reader

    decoded = []

    def counting(*args, **kwargs):
        done = tiles.read_window(*args, **kwargs)
        decoded.append(done)
        return done

    monkeypatch.setattr(reader, "read_window", counting)
    planes = {}
    for decoder in ("tiles", "gdal"):
        if decoder == "gdal":
            monkeypatch.setenv(tiles.ENV_SWITCH, "gdal")
        datasets.clear_cache()
        planes[decoder] = read_planes(job, (3, 141), (17, 250))
        if decoder == "tiles":
            assert decoded and all(decoded) and len(decoded) == sum(r is not None for i in job.reads for r in i)
            decoded.clear()
    assert not decoded, "with the switch set, GDAL reads every window"
    for a in range(len(job.assets)):
        assert planes["tiles"].raw[a].tobytes() == planes["gdal"].raw[a].tobytes()
        assert planes["tiles"].raw[a].any()
    datasets.clear_cache()


def _sample_job(sample, tmp_path):
    from rasterflow.graph import local_read_job
    from rasterflow.planning import local_layout
    from rasterflow.commands import plan_with_items, search
    from rasterflow.spec import load_spec

    from conftest import spec_text

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(spec_text(sample))
    loaded = load_spec(spec_path)
    plan = plan_with_items(loaded, search(loaded), local_layout(loaded.spec))
    assert plan.sources is not None
    return local_read_job(plan, range(len(plan.sources.reads)), (0, 200), (0, 300))


def test_predicted_tiles_wider_than_the_compiled_row_are_decoded_by_imagecodecs(tmp_path):
    """The compiled predictor kernel takes tiles up to MAX_PREDICTED_TILE_WIDTH wide; a wider 16-bit ZSTD tile with
    the horizontal predictor (legal TIFF) is left to imagecodecs and still reads as GDAL reads it."""
    from rasterflow import compiled

    kernels = compiled.module()
    if kernels is None:
        pytest.skip("the compiled kernels are not built here")
    wide = kernels.MAX_PREDICTED_TILE_WIDTH + 32
    values = (np.arange(32 * wide).reshape(32, wide) * 7 % 5003).astype(np.uint16)
    path = tmp_path / "wide.tif"
    with rasterio.open(path, "w", driver="GTiff", width=wide, height=32, count=1, dtype="uint16",
                       crs="EPSG:32633", transform=from_origin(500000, 6000000, 10, 10), tiled=True,
                       blockxsize=wide, blockysize=16, compress="ZSTD", predictor=2) as dst:
        dst.write(values, 1)
    index = _index(path)
    assert index is not None and index.predicted is None
    got = np.zeros((20, wide - 3), dtype=np.uint16)
    assert tiles.read_window(index, 5, 3, got)
    np.testing.assert_array_equal(got, values[5:25, 3:])

