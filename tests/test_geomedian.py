"""rasterflow.geomedian: geomad's geomedian and MADs per block, against an independent NumPy reference, against
geomad on the whole tile, NaN handling and count, and the memory formula."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pytest

from rasterflow.geomedian import (
    DEFAULT_EPS,
    DEFAULT_MAXITERS,
    geomedian_block,
    geomedian_output_bytes,
    geomedian_variables,
    geomedian_work_bytes,
    slab_rows,
)

geomad = pytest.importorskip("geomad")


def reflectances(t: int, b: int, y: int, x: int, *, gaps: float = 0.3, seed: int = 0) -> np.ndarray:
    """(time, band, y, x) float32: per-pixel spectra with noise, some dates cloudy (bright), ``gaps`` masked."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.02, 0.4, size=(1, b, y, x))
    stack = base * (1 + 0.15 * rng.standard_normal((t, b, y, x)))
    stack += np.where(rng.random((t, 1, y, x)) < 0.1, 0.5, 0.0)
    stack[np.broadcast_to(rng.random((t, 1, y, x)) < gaps, stack.shape)] = np.nan
    return stack.astype(np.float32)


# ------------------------------------------------------------------------------------------------------------------
# the independent reference: Weiszfeld's iteration with Vardi & Zhang's step at a data point, float64, per pixel


def weiszfeld(points: np.ndarray, iterations: int = 20000, tol: float = 1e-12) -> np.ndarray:
    """The geometric median of ``points`` (n, band): argmin_y sum_i ||x_i - y||."""
    y = points.mean(axis=0)
    for _ in range(iterations):
        distance = np.linalg.norm(points - y, axis=1)
        at = distance < 1e-15
        weight = 1.0 / distance[~at]
        moved = (weight[:, None] * points[~at]).sum(axis=0) / weight.sum()
        if at.any():  # y sits on a data point: Vardi-Zhang
            r = np.linalg.norm((weight[:, None] * (points[~at] - y)).sum(axis=0))
            share = at.sum() / r if r > 0 else 1.0
            moved = max(0.0, 1 - share) * moved + min(1.0, share) * y
        if np.linalg.norm(moved - y) < tol:
            return moved
        y = moved
    return y


def valid_observations(stack: np.ndarray, row: int, col: int) -> np.ndarray:
    """(n, band) float64 observations of one pixel with every band valid."""
    pixel = stack[:, :, row, col].astype(np.float64)
    return pixel[np.isfinite(pixel).all(axis=1)]


def objective(points: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(points - y, axis=1).sum())


def test_geomedian_equals_weiszfeld_reference():
    stack = reflectances(15, 4, 8, 9, seed=1)
    converged = geomedian_block(stack, eps=1e-7, maxiters=100000, mads=False)
    default = geomedian_block(stack, mads=False)
    for row in range(8):
        for col in range(9):
            points = valid_observations(stack, row, col)
            if len(points) == 0:
                continue
            reference = weiszfeld(points)
            np.testing.assert_allclose(converged[:4, row, col], reference, atol=2e-5)
            # with the defaults the estimate is a near-minimiser: the sum of distances within 1e-4 of the optimum
            assert objective(points, default[:4, row, col].astype(np.float64)) <= objective(points, reference) * (1 + 1e-4)
            np.testing.assert_allclose(default[:4, row, col], reference, atol=2e-3)


def test_mads_follow_their_definitions():
    stack = reflectances(20, 5, 7, 6, seed=2)
    out = geomedian_block(stack)
    names = geomedian_variables(["a", "b", "c", "d", "e"])
    assert names == ("a", "b", "c", "d", "e", "emad", "smad", "bcmad", "count")
    for row in range(7):
        for col in range(6):
            points = valid_observations(stack, row, col)
            gm = out[:5, row, col].astype(np.float64)
            euclid = np.linalg.norm(points - gm, axis=1)
            cosine = 1 - points @ gm / (np.linalg.norm(points, axis=1) * np.linalg.norm(gm))
            bray = np.abs(points - gm).sum(axis=1) / np.abs(points + gm).sum(axis=1)
            assert out[names.index("count"), row, col] == len(points)
            np.testing.assert_allclose(out[5, row, col], np.median(euclid), rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(out[6, row, col], np.median(cosine), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(out[7, row, col], np.median(bray), rtol=1e-5, atol=1e-7)


def test_equals_geomad_on_the_whole_tile_bit_for_bit_in_any_slabs():
    """What odc-algo's _gm_mads_compute_f32 computes on the whole (y, x, band, time) array, whatever the slabs."""
    stack = reflectances(16, 4, 33, 21, seed=3)
    stack[:, :, 5, 7] = np.nan          # no observation
    stack[1:, :, 6, 7] = np.nan         # one
    yxbt = np.ascontiguousarray(stack.transpose(2, 3, 1, 0))
    gm = geomad.nangeomedian_pcm(yxbt, maxiters=DEFAULT_MAXITERS, eps=DEFAULT_EPS, num_threads=1, nocheck=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmedian of the empty pixel
        reference = [geomad.emad_pcm(yxbt, gm, num_threads=1), geomad.smad_pcm(yxbt, gm, num_threads=1),
                     geomad.bcmad_pcm(yxbt, gm, num_threads=1)]
    count = np.isfinite(stack).all(axis=1).sum(axis=0)
    expected = np.concatenate([gm.transpose(2, 0, 1), np.stack(reference), count[None]]).astype(np.float32)
    expected[:-1, count == 0] = np.nan
    for work_pixels in (None, 21, 5 * 21, 1000, 10**9):
        out = geomedian_block(stack, work_pixels=work_pixels)
        np.testing.assert_array_equal(out, expected, err_msg=f"work_pixels={work_pixels}")


@pytest.mark.parametrize("t, b, seed", [(24, 4, 11), (7, 6, 12), (36, 2, 13)])
def test_mads_are_geomads_bit_for_bit(t, b, seed):
    """The MADs computed here (geomad's per-date distances as its loops compute them, the median by
    rasterflow.fastreduce) against geomad's emad_pcm / smad_pcm / bcmad_pcm of the same slab and geomedian: one band
    masked alone at some dates, zero spectra, a zero geomedian, pixels with one or no observation."""
    stack = reflectances(t, b, 40, 37, seed=seed)
    rng = np.random.default_rng(seed)
    stack[rng.random(stack.shape) < 0.05] = np.nan      # single bands masked: those dates are not used
    stack[:, :, 3, 4] = 0.0                              # every observation zero: geomedian zero (smad, bcmad NaN)
    stack[: t // 2, :, 5, 6] = 0.0                       # half the observations zero
    stack[1:, :, 7, 8] = np.nan                          # one observation
    stack[:, :, 9, 10] = np.nan                          # none
    out = geomedian_block(stack)
    yxbt = np.ascontiguousarray(stack.transpose(2, 3, 1, 0))  # the kernel's slab (NaN only: no infinities here)
    gm = np.ascontiguousarray(out[:b].transpose(1, 2, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmedian of all-NaN distances
        reference = np.stack([geomad.emad_pcm(yxbt, gm, num_threads=1), geomad.smad_pcm(yxbt, gm, num_threads=1),
                              geomad.bcmad_pcm(yxbt, gm, num_threads=1)])
    np.testing.assert_array_equal(out[b:b + 3], reference)
    assert np.isnan(out[b + 1:b + 3, 3, 4]).all() and np.isnan(out[b:b + 3, 9, 10]).all()


def test_layouts_and_dtypes_give_the_same_result():
    stack = reflectances(10, 3, 12, 11, seed=4)
    out = geomedian_block(stack, work_pixels=22)
    np.testing.assert_array_equal(geomedian_block([stack[:, b] for b in range(3)], work_pixels=22), out)
    np.testing.assert_array_equal(geomedian_block(stack.astype(np.float64), work_pixels=22), out)
    no_mads = geomedian_block(stack, mads=False)
    assert no_mads.shape == (4, 12, 11)
    np.testing.assert_array_equal(no_mads, out[[0, 1, 2, 6]])
    assert geomedian_variables(["r", "g"], mads=False) == ("r", "g", "count")


# ------------------------------------------------------------------------------------------------------------------
# missing data


def test_pixels_with_zero_or_one_valid_observation_and_partial_ones():
    stack = reflectances(6, 3, 2, 4, gaps=0.0, seed=5)
    stack[:, :, 0, 0] = np.nan                      # none
    stack[1:, :, 0, 1] = np.nan                     # one: dates 1.. missing
    stack[:, 1, 0, 2] = np.nan                      # every date misses one band: no complete observation
    stack[0, 0, 0, 3] = np.nan                      # a partial observation is not counted, the rest are
    stack[2, 2, 0, 3] = np.inf                      # +-inf is missing too
    stack[3, 1, 0, 3] = -np.inf
    out = geomedian_block(stack)
    assert np.isnan(out[:-1, 0, 0]).all() and out[-1, 0, 0] == 0
    np.testing.assert_array_equal(out[:3, 0, 1], stack[0, :, 0, 1])
    assert out[3, 0, 1] == 0 and abs(out[4, 0, 1]) < 1e-6 and out[5, 0, 1] == 0 and out[-1, 0, 1] == 1
    assert np.isnan(out[:-1, 0, 2]).all() and out[-1, 0, 2] == 0
    assert out[-1, 0, 3] == 3
    points = valid_observations(stack, 0, 3)
    assert len(points) == 3
    np.testing.assert_allclose(out[:3, 0, 3], weiszfeld(points), atol=2e-3)
    assert np.isfinite(out[:, 1]).all()
    np.testing.assert_array_equal(out[-1], np.isfinite(stack).all(axis=1).sum(axis=0))


def test_every_pixel_empty_and_no_dates():
    out = geomedian_block(np.full((5, 2, 3, 3), np.nan, dtype=np.float32))
    assert np.isnan(out[:-1]).all() and (out[-1] == 0).all()
    out = geomedian_block(np.empty((0, 2, 3, 3), dtype=np.float32))
    assert out.shape == (6, 3, 3) and np.isnan(out[:-1]).all() and (out[-1] == 0).all()
    assert geomedian_block(np.empty((4, 2, 0, 3), dtype=np.float32)).shape == (6, 0, 3)


def test_zero_geomedian_gives_nan_where_a_distance_is_undefined_without_warning():
    """Warnings are errors in this test suite: nanmedian's "All-NaN slice" would fail it."""
    stack = np.zeros((4, 2, 1, 3), dtype=np.float32)
    stack[:, :, 0, 1] = [[1, 0], [-1, 0], [0, 1], [0, -1]]   # symmetric about the origin: geomedian 0
    stack[:, :, 0, 2] = [[0.2, 0.3], [0.25, 0.3], [0.2, 0.35], [np.nan, np.nan]]
    out = geomedian_block(stack)
    gm, emad, smad, bcmad, count = out[:2], out[2], out[3], out[4], out[5]
    np.testing.assert_array_equal(gm[:, 0, :2], 0)
    assert emad[0, 0] == 0 and np.isnan(smad[0, 0]) and np.isnan(bcmad[0, 0])       # all zero
    assert emad[0, 1] == 1 and np.isnan(smad[0, 1]) and bcmad[0, 1] == 1            # cosine undefined only
    assert np.isfinite(out[:, 0, 2]).all() and count.tolist() == [[4, 4, 3]]


def test_bad_arguments():
    stack = reflectances(3, 2, 2, 2)
    with pytest.raises(ValueError, match="expected a \\(time, band, y, x\\) stack"):
        geomedian_block(stack[0])
    with pytest.raises(ValueError, match="of one shape"):
        geomedian_block([stack[:, 0], stack[:2, 1]])
    with pytest.raises(ValueError, match="at least one band"):
        geomedian_block([])
    with pytest.raises(ValueError, match="eps must be positive"):
        geomedian_block(stack, eps=0)
    with pytest.raises(ValueError, match="maxiters must be at least 1"):
        geomedian_block(stack, maxiters=0)
    with pytest.raises(ValueError, match="work_pixels must be a positive"):
        geomedian_block(stack, work_pixels=0)


# ------------------------------------------------------------------------------------------------------------------
# memory


def test_slab_rows():
    assert slab_rows(1024, 1024, 512 * 512) == 256
    assert slab_rows(1024, 1024, None) == 1024
    assert slab_rows(10, 1024, 5) == 1          # at least one row
    assert slab_rows(10, 100, 10**9) == 10      # at most the block


def test_formula_grows_with_each_dimension():
    base = geomedian_work_bytes(36, 4, 512 * 512)
    assert geomedian_work_bytes(72, 4, 512 * 512) > base
    assert geomedian_work_bytes(36, 8, 512 * 512) > base
    assert geomedian_work_bytes(36, 4, 1024 * 1024) > base
    assert base >= 36 * 4 * 512 * 512 * 4  # at least the (y, x, band, time) float32 copy
    assert geomedian_output_bytes(4, 100) == 4 * 8 * 100 and geomedian_output_bytes(4, 100, mads=False) == 4 * 5 * 100


@pytest.mark.parametrize("t, b, side, work_pixels", [(24, 4, 128, None), (12, 6, 96, None), (24, 4, 128, 32 * 128)])
def test_numpy_allocations_within_the_formula(t, b, side, work_pixels):
    """tracemalloc sees every NumPy array of the kernel (geomad's C buffers are O(band + time) per thread): the
    peak stays within the formula for the slab plus the output, and a slab bounds it whatever the block."""
    stack = reflectances(t, b, side, side, seed=6)
    geomedian_block(stack[:, :, :1], work_pixels=work_pixels)  # warm-up: imports, caches
    tracemalloc.start()
    try:
        geomedian_block(stack, work_pixels=work_pixels)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = slab_rows(side, side, work_pixels)
    bound = geomedian_work_bytes(t, b, rows * side) + geomedian_output_bytes(b, side * side)
    assert peak <= bound, (peak, bound)
    assert peak >= 0.7 * bound, (peak, bound)   # and the formula is not loose


_RSS_CHILD = r"""
import json
import numpy as np
from rasterflow.geomedian import geomedian_block

def status(key):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(key + ":"))

stack = np.empty((36, 4, 256, 256), dtype=np.float32)
rng = np.random.default_rng(0)
for date in range(36):
    stack[date] = rng.uniform(0.02, 0.5, size=(4, 256, 256))
    stack[date][:, rng.random((256, 256)) < 0.3] = np.nan
geomedian_block(stack[:, :, :1], work_pixels=None)
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as reset:  # resets VmHWM to the current RSS (Linux >= 4.0)
    reset.write("5")
geomedian_block(stack, work_pixels=None)
print(json.dumps(status("VmHWM") - before))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_process_peak_within_the_formula():
    """The OS's view (the peak resident set over the call, in a fresh process) of one 256² x 36-date x 4-band slab.
    A fixed mmap threshold keeps glibc from serving the kernel's arrays out of heap freed by the warm-up."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD], capture_output=True, text=True, check=True,
                          timeout=300, env=env)
    grown = json.loads(done.stdout.strip().splitlines()[-1])
    bound = geomedian_work_bytes(36, 4, 256 * 256) + geomedian_output_bytes(4, 256 * 256)
    assert 0.5 * bound <= grown <= 1.05 * bound, (grown, bound)  # 5%: pages, the interpreter's own allocations
