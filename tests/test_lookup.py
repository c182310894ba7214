"""Per-value tables (rasterflow.lookup) and the kernel that gathers from them: the same values, bit for bit, as the
arithmetic on the planes and as an independent NumPy reference, for every small integer dtype."""

from __future__ import annotations

import numpy as np
import pytest

from rasterflow import kernels, lookup
from rasterflow.expr import parse_expression

SMALL = ("uint8", "int8", "uint16", "int16")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal NaN positions and equal bits everywhere else (so +0.0 and -0.0 differ)."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(nan_a, nan_b):
        return False
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(a[~nan_a].view(bits), b[~nan_b].view(bits)))


def reference_working(raw: np.ndarray, dtype: str, scale: float, offset: float, nodata: float) -> np.ndarray:
    """The float reference's order: cast, multiply, add (in the working dtype), then NaN where raw is nodata."""
    work = np.dtype(dtype)
    values = raw.astype(work) * work.type(scale)
    values = values + work.type(offset)
    if not np.isnan(nodata):
        values = np.where(raw == nodata, work.type(np.nan), values)
    return values


def random_raw(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


@pytest.mark.parametrize("raw_dtype", SMALL)
@pytest.mark.parametrize("work", ["float32", "float64"])
@pytest.mark.parametrize("scale, offset, nodata", [
    (1e-4, -0.1, 0.0),            # Sentinel-2 L2A after the 2022 baseline
    (2.75e-5, -0.2, 0.0),         # Landsat C2 L2 reflectance
    (1.0, 0.0, np.nan),           # no scaling, no nodata
    (-0.5, 3.0, -1.0),            # negative scale: -0.0 can appear, and a negative nodata
    (1.0, 0.0, -9999.0),          # a nodata the dtype cannot hold
])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_a_gathered_plane_equals_the_arithmetic_and_the_reference(raw_dtype, work, scale, offset, nodata, native):
    rng = np.random.default_rng(3)
    raw = random_raw(rng, raw_dtype, (64, 97))
    raw[::7, ::5] = 0  # make sure the nodata value 0 is there
    if np.iinfo(raw_dtype).min < 0:
        raw[1::9, ::3] = -1
    table = lookup.working_table(np.dtype(raw_dtype), np.dtype(work), scale, offset, nodata)
    assert table is not None and table.size == 2 ** (8 * np.dtype(raw_dtype).itemsize)
    gathered = lookup.gather(table, raw, native=native)
    assert gathered.shape == raw.shape and gathered.dtype == np.dtype(work)
    arithmetic = lookup.scaled(raw, np.dtype(work), scale, offset, nodata)
    assert same_bits(gathered, arithmetic)
    assert same_bits(gathered, reference_working(raw, work, scale, offset, nodata))
    assert bool(np.isnan(gathered).any()) == (not np.isnan(nodata) and bool((raw == nodata).any()))


def test_wide_and_float_sources_have_no_table():
    for dtype in ("uint32", "int32", "float32", "float64"):
        assert lookup.working_table(np.dtype(dtype), np.dtype("float32"), 1.0, 0.0, 0.0) is None
    mask = parse_expression("scl == 9", ["scl"])
    assert lookup.mask_addend_table(mask, np.dtype("uint32"), np.dtype("float32")) is None
    two = parse_expression("(scl == 9) | (qa > 3)", ["scl", "qa"])
    assert lookup.mask_addend_table(two, np.dtype("uint8"), np.dtype("float32")) is None


def test_tables_are_cached_and_read_only():
    a = lookup.working_table(np.dtype("uint16"), np.dtype("float32"), 1e-4, -0.1, 0.0)
    b = lookup.working_table(np.dtype("uint16"), np.dtype("float32"), np.float64(1e-4), np.float64(-0.1), np.float64(0))
    assert a is b and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1


@pytest.mark.parametrize("text, raw_dtype", [
    ("scl in (3, 8, 9, 10)", "uint8"),
    ("scl not in (4, 5)", "uint8"),
    ("(qa >> 3) & 1", "uint16"),               # a bit test: nonzero = drop
    ("((qa >> 1) & 3) | (qa & 1)", "uint16"),
    ("(qa < -5) | (qa == 7)", "int16"),
    ("~(qa > 3)", "int8"),
    ("qa > 300", "uint8"),                     # never true for uint8
    ("1 < qa < 100", "uint16"),
])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_a_mask_table_gathers_what_the_mask_gives_on_each_pixel(text, raw_dtype, native):
    name = "scl" if "scl" in text else "qa"
    mask = parse_expression(text, [name])
    raw = random_raw(np.random.default_rng(5), raw_dtype, (33, 41))
    raw[0, :20] = np.arange(20)  # the listed classes are certainly there
    table = lookup.mask_addend_table(mask, np.dtype(raw_dtype), np.dtype("float32"))
    assert table is not None
    addend = lookup.gather(table, raw, native=native)
    expected_drop = np.broadcast_to(np.asarray(mask.evaluate({name: raw})) != 0, raw.shape)
    np.testing.assert_array_equal(np.isnan(addend), expected_drop)
    assert np.all(np.signbit(addend[~expected_drop]))  # -0.0: adding it changes nothing


def test_adding_the_addend_keeps_every_float_and_sets_nan_where_asked():
    values = np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], dtype=np.float32)
    for dtype in (np.float32, np.float64):
        x = values.astype(dtype)
        keep = x + lookup.nan_addend(np.zeros(x.shape, bool), np.dtype(dtype))
        assert same_bits(keep, x)
        bad = np.arange(x.size) % 2 == 0
        dropped = x + lookup.nan_addend(bad, np.dtype(dtype))
        np.testing.assert_array_equal(np.isnan(dropped), bad | np.isnan(x))
        assert same_bits(dropped[~bad], x[~bad])


def _reference_series(raws, assets, scale, offset, nodata, drop_of, band) -> np.ndarray:
    """Per date: every asset the reference way, NaN where the mask drops, then the band."""
    out = []
    for t in range(raws[0].shape[0]):
        env = {name: reference_working(raws[a][t], "float32", scale[t, a], offset[t, a], nodata[t, a])
               for a, name in enumerate(assets)}
        drop = drop_of({name: raws[a][t] for a, name in enumerate(assets)})
        with np.errstate(all="ignore"):
            for name in env:
                env[name] = np.where(drop, np.float32(np.nan), env[name])
            out.append(band(env).astype(np.float32))
    return np.stack(out)


@pytest.mark.parametrize("mask_text, drop_of", [
    ("(qa >> 3) & 1", lambda raw: ((raw["qa"] >> 3) & 1) != 0),                          # one uint16 asset: a table
    ("((qa >> 3) & 1) | (red < -50)", lambda raw: (((raw["qa"] >> 3) & 1) != 0) | (raw["red"] < -50)),  # two: arithmetic
])
def test_the_kernel_on_signed_sources_and_qa_masks_equals_numpy(mask_text, drop_of):
    """int16 reflectances with a negative nodata and per-date scale/offset, an int8 band, a uint16 QA bit mask:
    the masked band series and its median equal the NumPy reference computed plane by plane."""
    rng = np.random.default_rng(11)
    dates, shape = 5, (40, 56)
    red = rng.integers(-200, 3000, (dates, *shape), dtype=np.int16)
    nir = rng.integers(-100, 120, (dates, *shape), dtype=np.int8)
    qa = rng.integers(0, 2 ** 16, (dates, *shape), dtype=np.uint16)
    red[rng.random(red.shape) < 0.05] = -9999
    assets = ("red", "nir", "qa")
    scale = np.array([[1e-4, 0.01, 1.0]] * dates) * rng.uniform(0.5, 2.0, (dates, 1))
    offset = np.array([[-0.1, 0.0, 0.0]] * dates)
    nodata = np.array([[-9999.0, -128.0, np.nan]] * dates)
    planes = kernels.Planes(raw=(red, nir, qa), covered=(None, None, None), nodata=nodata, scale=scale,
                            offset=offset)
    program = kernels.Program(assets=assets, mask=parse_expression(mask_text, list(assets)),
                              masked_assets=("red", "nir"),
                              bands=(("ratio", parse_expression("(nir - red) / (nir + red)", ["red", "nir"])),),
                              dtype="float32", reduce_method="median")
    expected = _reference_series((red, nir, qa), assets, scale, offset, nodata, drop_of,
                                 lambda env: (env["nir"] - env["red"]) / (env["nir"] + env["red"]))
    series = kernels._band_series(planes, program)["ratio"]
    assert same_bits(series, expected)
    assert 0.2 < np.isnan(series).mean() < 0.9  # the mask and the nodata both bit
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(expected, axis=0)
    assert same_bits(kernels.reduce_block(planes, program)[0, 0, 0], median)


@pytest.mark.parametrize("raw_dtype", [">i2", ">u2", "<i2"])
def test_a_non_native_byte_order_gathers_the_same_values(raw_dtype):
    raw = np.array([[-300, -1, 0, 1, 7, 32767]], dtype=np.int16).astype(raw_dtype) if "i" in raw_dtype else \
        np.array([[0, 1, 7, 65535]], dtype=np.uint16).astype(raw_dtype)
    table = lookup.working_table(raw.dtype, np.dtype("float32"), 0.5, 1.0, -1.0)
    assert table is not None
    for native in (True, False):
        assert same_bits(lookup.gather(table, raw, native=native), reference_working(raw, "float32", 0.5, 1.0, -1.0))
    strided = np.ascontiguousarray(np.repeat(raw, 2, axis=1))[:, ::2]  # not contiguous: NumPy's take, same values
    assert same_bits(lookup.gather(table, strided, native=True), reference_working(raw, "float32", 0.5, 1.0, -1.0))


def test_the_compiled_gather_checks_its_table():
    from rasterflow import _native

    raw = np.arange(12, dtype=np.uint16).reshape(3, 4)
    with pytest.raises(ValueError, match="every value"):
        _native.take(np.zeros(256, np.float32), raw, np.empty((3, 4), np.float32))  # a uint8 table for uint16
    with pytest.raises(ValueError, match="output"):
        _native.take(np.zeros(65536, np.float32), raw, np.empty((3, 4), np.float64))
    with pytest.raises(TypeError, match="uint8/uint16"):
        _native.take(np.zeros(65536, np.float32), raw.astype(np.int32), np.empty((3, 4), np.float32))


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("raw_dtype, mask_dtype", [("uint16", "uint8"), ("uint8", "uint16"), ("int16", "int8"),
                                                   ("uint16", "uint16")])
@pytest.mark.parametrize("work", ["float32", "float64"])
def test_a_gather_with_the_mask_addend_equals_the_two_gathers_added(raw_dtype, mask_dtype, work, native):
    """The fused gather (an asset's working values plus its mask's NaN / -0.0 addend in one pass) gives the values
    the asset plane plus the addend plane give: NaN where the mask drops or the value is nodata, else the value."""
    rng = np.random.default_rng(11)
    raw = random_raw(rng, raw_dtype, (37, 29))
    raw[::5, ::3] = 0  # nodata
    qa = random_raw(rng, mask_dtype, raw.shape)
    mask = parse_expression("(qa & 3) == 1", ["qa"])
    values_table = lookup.working_table(np.dtype(raw_dtype), np.dtype(work), 1e-4, -0.1, 0.0)
    mask_table = lookup.mask_addend_table(mask, np.dtype(mask_dtype), np.dtype(work))
    assert values_table is not None and mask_table is not None
    fused = lookup.gather(values_table, raw, addend=(mask_table, qa), native=native)
    expected = reference_working(raw, work, 1e-4, -0.1, 0.0)
    drop = np.asarray(mask.evaluate({"qa": qa})) != 0
    expected[drop] = np.nan
    assert drop.any() and (~drop).any()
    assert same_bits(fused, expected)
    assert same_bits(fused, values_table.take(lookup.table_index(raw)) + mask_table.take(lookup.table_index(qa)))
