"""COG tiles compressed on the workers and assembled behind GDAL's header (``write.cogtiles``, ``write.cogassembly``).

Every file is read back with rasterio (GDAL) and checked: valid COG (rio-cogeo, strict), GDAL's ``LAYOUT=COG``,
the full resolution pixel for pixel equal to the input and to the file GDAL's COG driver makes of the same data
(``RASTERFLOW_COG_WRITER=gdal``), the same metadata as GDAL's file, and every overview level equal to an
independent NumPy reference (``np.nanmean`` over 2 x 2 blocks, level after level).
"""

from __future__ import annotations

import os
import warnings

import dask.array as da
import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine
from rio_cogeo.cogeo import cog_validate

from rasterflow.errors import RunFailedError
from rasterflow.write import cog as cog_module
from rasterflow.write import cogtiles, stac, stacstats, write_cog
from rasterflow.write.common import Encoding

CRS = "EPSG:32633"
TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)


def _values(seed: int, shape: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.normal(0.3, 0.2, size=shape).astype(np.float32)
    values[rng.random(shape) < 0.2] = np.nan
    values[: shape[0] // 5, : shape[1] // 4] = np.nan  # whole tiles and overview pixels with nothing valid
    values[-3:, :] = np.float32(0.25)  # ties in a 2 x 2 block
    return values


def _dataset(shape: tuple[int, int], chunk: int, names: tuple[str, ...], lead: dict | None = None,
             seed: int = 0) -> tuple[xr.Dataset, dict[str, np.ndarray]]:
    lead = lead or {}
    full = tuple(len(v) for v in lead.values()) + shape
    values = {name: _values(seed + k, full[-2:]) if not lead else
              np.stack([_values(seed + 10 * k + e, shape) for e in range(int(np.prod(full[:-2])))]).reshape(full)
              for k, name in enumerate(names)}
    dims = tuple(lead) + ("y", "x")
    chunks = (1,) * len(lead) + (chunk, chunk)
    coords = {**lead, "y": TRANSFORM.f + TRANSFORM.e * (np.arange(shape[0]) + 0.5),
              "x": TRANSFORM.c + TRANSFORM.a * (np.arange(shape[1]) + 0.5)}
    ds = xr.Dataset({n: (dims, da.from_array(v, chunks=chunks)) for n, v in values.items()}, coords=coords)
    for name in names:
        ds[name].attrs["rasterflow_expression"] = f"{name} * 1"
    return ds.rio.write_crs(CRS).rio.write_transform(TRANSFORM), values


def _reference_levels(values: np.ndarray, count: int) -> list[np.ndarray]:
    """Overview levels by NumPy alone: each the nanmean of the 2 x 2 blocks of the level above, odd edges left out."""
    levels, current = [], values.astype(np.float64)
    for _ in range(count):
        rows, cols = current.shape[0] // 2, current.shape[1] // 2
        blocks = current[: rows * 2, : cols * 2].reshape(rows, 2, cols, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks
            current = np.nanmean(blocks, axis=(1, 3))
        levels.append(current)
    return levels


@pytest.fixture
def assembled(monkeypatch):
    """Counts the writes that took the worker-compressed path."""
    calls = []
    original = cog_module.WorkerTiledCog.write

    def spy(self):
        calls.append(self.layout)
        return original(self)

    monkeypatch.setattr(cog_module.WorkerTiledCog, "write", spy)
    return calls


def _check_ghost_blocks(path: str) -> None:
    """GDAL's ghost area promises each tile behind its size (4 bytes) and followed by its last 4 bytes: checked
    for every tile of every level from the file's own offsets (tifffile)."""
    import struct

    from tifffile import TiffFile

    with open(path, "rb") as f:
        data = f.read()
    assert b"BLOCK_LEADER=SIZE_AS_UINT4" in data[:400] and b"BLOCK_TRAILER=LAST_4_BYTES_REPEATED" in data[:400]
    with TiffFile(path) as tif:
        for page in tif.pages:
            for offset, size in zip(page.dataoffsets, page.databytecounts):
                assert size > 0
                assert struct.unpack("<I", data[offset - 4:offset])[0] == size
                assert data[offset + size:offset + size + 4] == data[offset + size - 4:offset + size]


def _meta(path: str) -> dict:
    with rasterio.open(path) as src:
        return {
            "profile": {k: v for k, v in src.profile.items() if k != "nodata"},
            "nodata": [str(v) for v in src.nodatavals],
            "tags": src.tags(), "band_tags": [src.tags(b) for b in range(1, src.count + 1)],
            "descriptions": src.descriptions, "scales": src.scales, "offsets": src.offsets,
            "overviews": src.overviews(1), "structure": src.tags(ns="IMAGE_STRUCTURE"),
        }


CASES = [
    # shape, chunk, blocksize, bands, encoding, compression
    pytest.param((600, 520), 256, 128, ("ndvi",), None, "zstd", id="one-band-partial-edges"),
    pytest.param((1030, 700), 512, 256, ("red", "nir", "ndvi"), None, "zstd", id="three-bands-pixel-interleaved"),
    pytest.param((700, 900), 256, 256, ("ndvi",), Encoding(dtype="int16", scale=1e-4, nodata=-32768), "deflate",
                 id="scaled-int16-deflate"),
    pytest.param((520, 600), 128, 128, ("ndvi",), None, "lzw", id="lzw-odd-levels"),
    pytest.param((300, 260), 1024, 128, ("ndvi",), None, "none", id="one-chunk-uncompressed"),
    pytest.param((300, 2600), 1024, 512, ("ndvi", "evi"), None, "zstd", id="one-chunk-high-many-wide"),
]


@pytest.mark.parametrize("shape,chunk,blocksize,names,encoding,compression", CASES)
def test_worker_tiles_make_the_cog_gdal_makes(tmp_path, monkeypatch, assembled, shape, chunk, blocksize, names,
                                              encoding, compression):
    ds, values = _dataset(shape, chunk, names)
    fast, slow = str(tmp_path / "fast" / "out.tif"), str(tmp_path / "gdal" / "out.tif")
    result = write_cog(ds, fast, blocksize=blocksize, compression=compression, encoding=encoding,
                       metadata={"run": "x"})
    assert len(assembled) == 1, "the worker-compressed path was not taken"
    assert result.checksums[fast] == stac.file_checksum(fast)  # hashed as written
    monkeypatch.setenv("RASTERFLOW_COG_WRITER", "gdal")
    write_cog(ds, slow, blocksize=blocksize, compression=compression, encoding=encoding, metadata={"run": "x"})
    assert len(assembled) == 1
    assert os.listdir(tmp_path / "fast") == ["out.tif"]  # no template, spool or stream file left

    assert cog_validate(fast, strict=True) == (True, [], [])
    _check_ghost_blocks(fast)
    _check_ghost_blocks(slow)  # the same contract as GDAL's own file
    ours, gdals = _meta(fast), _meta(slow)
    assert ours["structure"]["LAYOUT"] == "COG"
    assert ours == gdals

    stored = (encoding or Encoding()).resolved(np.float32)
    with rasterio.open(fast) as src, rasterio.open(slow) as ref:
        np.testing.assert_array_equal(src.read(), ref.read())
        for band, name in enumerate(names, start=1):
            got = src.read(band, masked=True)
            physical = got.astype(np.float64) * stored.scale + stored.offset
            expected = values[name].astype(np.float64)
            assert np.array_equal(got.mask, np.isnan(expected))
            np.testing.assert_allclose(physical.filled(np.nan), expected, atol=stored.scale / 2 + 1e-7)
        levels = len(src.overviews(1))
        # the STAC statistics the workers computed tile by tile: the same numbers as reading the file back, and
        # NumPy's of the stored values
        from_tiles = stacstats.tile_statistics(result.statistics[fast], len(names))
        assert from_tiles == stacstats.cog_statistics(fast)
        for band, stat in enumerate(from_tiles, start=1):
            valid = src.read(band, masked=True).compressed().astype(np.float64)
            assert stat["minimum"] == valid.min() and stat["maximum"] == valid.max()
            assert stat["mean"] == pytest.approx(valid.mean(), rel=1e-12)
            assert stat["stddev"] == pytest.approx(valid.std(), rel=1e-9)
            assert stat["valid_percent"] == pytest.approx(100 * valid.size / (shape[0] * shape[1]))
    assert levels >= 1 or max(shape) <= blocksize
    for band, name in enumerate(names, start=1):
        reference = _reference_levels(values[name], levels)
        for level, expected in enumerate(reference):
            with rasterio.open(fast, overview_level=level) as ov:
                got = ov.read(band, masked=True)
            assert got.shape == expected.shape
            assert np.array_equal(got.mask, np.isnan(expected)), (name, level)
            physical = got.astype(np.float64) * stored.scale + stored.offset
            np.testing.assert_allclose(physical.filled(np.nan), expected, rtol=2e-6,
                                       atol=stored.scale * 0.51 + 1e-7)


def test_period_files_each_assembled(tmp_path, assembled):
    lead = {"period": ["2024-06", "2024-07"], "quantile": [0.1, 0.9]}
    ds, values = _dataset((600, 700), 256, ("ndvi",), lead)
    result = write_cog(ds, str(tmp_path / "ndvi.tif"), blocksize=256)
    assert len(assembled) == 1 and len(result.paths) == 4
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in result.paths)
    for k, path in enumerate(result.paths):
        p, q = divmod(k, 2)
        assert cog_validate(path, strict=True) == (True, [], [])
        with rasterio.open(path) as src:
            assert src.tags()["period"] == lead["period"][p]
            np.testing.assert_array_equal(src.read(1), values["ndvi"][p, q])
        with rasterio.open(path, overview_level=0) as ov:
            np.testing.assert_allclose(ov.read(1), _reference_levels(values["ndvi"][p, q], 1)[0].astype(np.float32),
                                       rtol=2e-6)


def test_a_failed_block_leaves_nothing(tmp_path, assembled):
    ds, values = _dataset((600, 520), 256, ("ndvi",))

    def fail(block, block_info=None):
        if block_info[0]["chunk-location"] == (1, 1):
            raise OSError("disk on fire")
        return block

    ds["ndvi"] = ds["ndvi"].copy(data=ds["ndvi"].data.map_blocks(fail, dtype=np.float32))
    out = tmp_path / "out"
    with pytest.raises(RunFailedError, match="disk on fire"):
        write_cog(ds, str(out / "ndvi.tif"), blocksize=128)
    assert len(assembled) == 1
    assert os.listdir(out) == []


def test_encoding_errors_from_the_workers_name_the_band(tmp_path, assembled):
    ds, _ = _dataset((300, 260), 128, ("ndvi",))
    ds["ndvi"] = ds["ndvi"] * 1000  # beyond int16 at scale 1e-4
    with pytest.raises(RunFailedError, match="ndvi"):
        write_cog(ds, str(tmp_path / "x.tif"), blocksize=128, encoding=Encoding(dtype="int16", scale=1e-4))
    assert len(assembled) == 1 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs,chunk", [
    ({"resampling": "nearest"}, 256),  # GDAL's resamplings other than average
    ({}, 300),  # chunks off the tile grid
])
def test_other_layouts_use_gdals_copy(tmp_path, assembled, kwargs, chunk):
    ds, values = _dataset((600, 520), chunk, ("ndvi",))
    path = str(tmp_path / "x.tif")
    write_cog(ds, path, blocksize=128, **kwargs)
    assert assembled == []
    assert cog_validate(path, strict=True) == (True, [], [])
    with rasterio.open(path) as src:
        np.testing.assert_array_equal(src.read(1), values["ndvi"])


@pytest.mark.parametrize("env,resampling,expected", [
    ("", "average", "WorkerTiledCog"),  # fast_layout allows the worker-compressed tiles
    ("", "nearest", "StreamedCog"),  # fast_layout is None: GDAL's copy
    ("gdal", "average", "StreamedCog"),  # assembly_enabled() is false
])
def test_write_cog_picks_the_writer_class(tmp_path, monkeypatch, env, resampling, expected):
    picked = []
    for cls in (cog_module.StreamedCog, cog_module.WorkerTiledCog):
        def spy(self, _original=cls.write):
            picked.append(type(self).__name__)
            return _original(self)

        monkeypatch.setattr(cls, "write", spy)
    monkeypatch.setenv("RASTERFLOW_COG_WRITER", env)
    ds, values = _dataset((300, 260), 128, ("ndvi",))
    path = str(tmp_path / "x.tif")
    write_cog(ds, path, blocksize=128, resampling=resampling)
    assert picked == [expected]
    with rasterio.open(path) as src:
        np.testing.assert_array_equal(src.read(1), values["ndvi"])


@pytest.mark.parametrize("height,width,blocksize", [(10980, 10980, 512), (3000, 2500, 512), (2745, 1373, 256),
                                                    (513, 4000, 512), (512, 512, 512), (1025, 90, 128)])
def test_level_shapes_are_gdals(tmp_path, height, width, blocksize):
    """``level_shapes`` predicts the overview sizes GDAL's COG driver makes (read from a sparse COG it wrote)."""
    from rasterflow.write.cogassembly import make_template

    sparse, template = str(tmp_path / "s.tif"), str(tmp_path / "t.tif")
    with rasterio.open(sparse, "w", driver="GTiff", width=width, height=height, count=1, dtype="float32",
                       crs=CRS, transform=TRANSFORM, nodata=np.nan, tiled=True, blockxsize=256, blockysize=256,
                       sparse_ok=True):
        pass
    make_template(sparse, template, {"BLOCKSIZE": blocksize, "OVERVIEWS": "AUTO", "COMPRESS": "ZSTD"})
    with rasterio.open(template) as src:
        factors = src.overviews(1)
    shapes = [(height, width)]
    for level in range(len(factors)):
        with rasterio.open(template, overview_level=level) as ov:
            shapes.append((ov.height, ov.width))
    assert cogtiles.level_shapes(height, width, blocksize) == tuple(shapes)


def test_halve_is_the_nanmean_of_each_2x2_block():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(2, 37, 50)).astype(np.float32)
    values[rng.random(values.shape) < 0.5] = np.nan
    values[:, :4, :4] = np.nan
    got = cogtiles.halve(values)
    assert got.shape == (2, 18, 25) and got.dtype == np.float32
    for band in range(2):
        np.testing.assert_allclose(got[band], _reference_levels(values[band], 1)[0].astype(np.float32), rtol=1e-6)
    assert np.isnan(got[:, :2, :2]).all()


def test_fast_layout_refuses_what_it_cannot_split():
    stored = Encoding().resolved(np.float32)
    common = dict(blocksize=512, computed_dtype=np.float32, stored=stored, band_names=("a",), compression="zstd",
                  predictor="auto")
    ok = cogtiles.fast_layout(height=10980, width=10980, chunks=((1024,) * 10 + (740,),) * 2, resampling="average",
                              **common)
    assert ok is not None and ok.worker_levels == 2 and ok.client_level == 2
    assert ok.levels[-1] == (343, 343)
    assert cogtiles.fast_layout(height=10980, width=10980, chunks=((1024,) * 10 + (740,),) * 2,
                                resampling="cubic", **common) is None
    assert cogtiles.fast_layout(height=2000, width=2000, chunks=((1000, 1000),) * 2, resampling="average",
                                **common) is None
    assert cogtiles.fast_layout(height=2000, width=2000, chunks=((1024, 976),) * 2, resampling="average",
                                **{**common, "computed_dtype": np.uint16}) is None
    # the client's levels of many large files beyond CLIENT_LEVELS_MAX_BYTES: GDAL's copy, one file at a time
    big = cogtiles.fast_layout(height=40960, width=40960, chunks=((512,) * 80,) * 2, resampling="average",
                               files=2, **common)
    assert big is None
