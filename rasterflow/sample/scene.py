"""The synthetic scenes: smooth random fields, the landscape of a tile, its surface reflectance on a date, clouds,
their shadows and cirrus, sensor noise and the conversion to DN and SCL. NumPy only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rasterflow.sample.grid import (
    OFFSET,
    SCALE,
    SampleParams,
    cut_col,
    has_swath_edge,
)

# --------------------------------------------------------------------------------------------------------------
# Smooth random fields (sums of sinusoids, evaluated separably)
# --------------------------------------------------------------------------------------------------------------

_PURPOSES = {
    "landscape": 1,
    "soil": 2,
    "texture": 3,
    "parcels": 4,
    "lake": 5,
    "river": 6,
    "turbidity": 7,
    "schedule": 8,
    "cloud": 9,
    "cirrus": 10,
    "noise": 11,
}


def _rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, _PURPOSES[purpose], *keys])


@dataclasses.dataclass(frozen=True)
class _Waves:
    fu: np.ndarray  # cycles per tile along u (columns, east)
    fv: np.ndarray  # cycles per tile along v (rows, south)
    phase: np.ndarray
    amp: np.ndarray  # normalised: the field has unit variance


def _waves(rng: np.random.Generator, n: int, fmin: float, fmax: float, beta: float = 1.0,
           direction: float | None = None, spread: float = math.pi) -> _Waves:
    freq = np.exp(rng.uniform(math.log(fmin), math.log(fmax), n))
    centre = rng.uniform(0, math.pi) if direction is None else direction
    theta = centre + rng.uniform(-spread / 2, spread / 2, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    amp = freq**-beta
    amp = amp / math.sqrt(float(np.sum(amp**2)) / 2.0)
    return _Waves(freq * np.cos(theta), freq * np.sin(theta), phase, amp)


def _field(w: _Waves, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum_k amp_k sin(2π(fu_k u + fv_k v) + phase_k) on the grid v (rows) x u (cols), float32.

    Separable: sin(a + b) = sin a cos b + cos a sin b, so the field is a (nv, 2n) x (2n, nu) product. It is
    computed with ``np.einsum(optimize=False)`` (NumPy's own single-threaded loops) rather than BLAS, whose
    results may depend on the thread count.
    """
    a = 2 * math.pi * np.outer(w.fu, u) + w.phase[:, None]  # (n, nu)
    b = 2 * math.pi * np.outer(w.fv, v)  # (n, nv)
    right = np.concatenate([np.sin(a) * w.amp[:, None], np.cos(a) * w.amp[:, None]]).astype(np.float32)
    left = np.concatenate([np.cos(b), np.sin(b)]).T.astype(np.float32, order="C")
    field: np.ndarray = np.einsum("vk,ku->vu", left, right, optimize=False)  # NumPy types einsum's result Any
    return field


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (0.5 * (1.0 + np.tanh(0.5 * x))).astype(np.float32, copy=False)


def _hash_uniform(ia: np.ndarray, ib: np.ndarray, seed: int, n: int) -> list[np.ndarray]:
    """n independent uniform [0, 1) values per integer cell (ia, ib), by a splitmix64-style hash."""
    with np.errstate(over="ignore"):
        x = (ia.astype(np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             ^ ib.astype(np.int64).astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
             ^ np.uint64((seed * 0x94D049BB133111EB + 0x632BE59BD9B4E019) % 2**64))
        out = []
        for i in range(n):
            z = x + np.uint64((i + 1) * 0x9E3779B97F4A7C15 % 2**64)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            out.append(((z >> np.uint64(40)).astype(np.float32) / np.float32(2**24)))
    return out


# --------------------------------------------------------------------------------------------------------------
# The scene model
# --------------------------------------------------------------------------------------------------------------

# surface reflectance spectra, bands in REFLECTANCE_ASSETS order (red, green, nir, swir16)
_VEG_LUSH = np.array([0.025, 0.070, 0.450, 0.170], dtype=np.float32)
_VEG_DRY = np.array([0.085, 0.100, 0.220, 0.280], dtype=np.float32)
_SOIL = np.array([0.160, 0.120, 0.220, 0.300], dtype=np.float32)
_URBAN = np.array([0.140, 0.130, 0.170, 0.200], dtype=np.float32)
_WATER = np.array([0.025, 0.045, 0.012, 0.005], dtype=np.float32)
_WATER_TURBID = np.array([0.045, 0.070, 0.030, 0.008], dtype=np.float32)
_CLOUD = np.array([0.580, 0.600, 0.640, 0.420], dtype=np.float32)
_CIRRUS = np.array([0.300, 0.310, 0.330, 0.220], dtype=np.float32)
_SHADOW_FACTOR = np.float32(0.28)
_NOISE_SIGMA = np.float32(0.002)
_NOISE_STRIDE = 7919
_NDVI_VEGETATION = 0.4

# seasonal curve over the series: peak at 40 % of the series
_SEASON_PEAK, _SEASON_WIDTH = 0.40, 0.5
# shadow displacement (tile units): clouds ~1 km high, sun at azimuth ~155°, elevation ~58°
_SHADOW_DISTANCE = 0.06
_SHADOW_AZIMUTH = math.radians(155.0 + 180.0)  # direction the shadow is cast to (NNW)


def _season(tau: float) -> float:
    return math.exp(-(((tau - _SEASON_PEAK) / _SEASON_WIDTH) ** 2))


@dataclasses.dataclass
class _Tile:
    """Static (date-independent) description of one tile: per-pixel class weights and parameters."""

    row: int
    col: int
    u: np.ndarray  # global column centres in tile units
    v: np.ndarray  # global row centres in tile units
    forest: np.ndarray  # weights, sum with agri + urban = 1 on land
    urban: np.ndarray
    agri: np.ndarray
    water: np.ndarray  # bool
    water_clear: np.ndarray  # weights of the clear / turbid water spectra (0 on land)
    water_turbid: np.ndarray
    soil_brightness: np.ndarray
    urban_brightness: np.ndarray
    urban_green: np.ndarray  # vegetation cover of built-up areas at the peak of the season
    texture: np.ndarray
    parcel_amp: np.ndarray
    parcel_shift: np.ndarray
    parcel_harvest: np.ndarray  # tau of harvest, > 1 = not harvested in the series
    parcel_edge: np.ndarray  # bool: hedges / field margins
    nodata_cut: np.ndarray  # bool: west of the swath edge (applies on swath-edge dates only)


def make_tile(params: SampleParams, row: int, col: int) -> _Tile:
    size, seed = params["size"], params["seed"]
    rows, cols = params["tiles"]
    gcols = col * size + np.arange(size, dtype=np.float64) + 0.5
    grows = row * size + np.arange(size, dtype=np.float64) + 0.5
    u, v = gcols / size, grows / size

    # land cover: forest (high), built-up (low), agriculture in between
    landscape = _field(_waves(_rng(seed, "landscape"), 16, 0.7, 4.0, beta=0.6), u, v)
    forest = _sigmoid((landscape - 0.7) / 0.06)
    urban = _sigmoid((-0.95 - landscape) / 0.06)
    agri = np.clip(1.0 - forest - urban, 0.0, 1.0)

    # agricultural parcels: a rotated grid, per-parcel crop parameters from a hash of the parcel index
    prng = _rng(seed, "parcels")
    angle = prng.uniform(-0.5, 0.5)
    width_a, width_b = prng.uniform(0.05, 0.07), prng.uniform(0.08, 0.12)
    uu, vv = u[None, :].astype(np.float32), v[:, None].astype(np.float32)
    a = uu * np.float32(math.cos(angle)) + vv * np.float32(math.sin(angle))
    b = vv * np.float32(math.cos(angle)) - uu * np.float32(math.sin(angle))
    fa, fb = a / np.float32(width_a), b / np.float32(width_b)
    ia, ib = np.floor(fa), np.floor(fb)
    if width_a * size >= 24:  # green field margins about 1 pixel wide, where parcels are big enough to show them
        edge = ((fa - ia) < np.float32(1.0 / (width_a * size))) | ((fb - ib) < np.float32(1.0 / (width_b * size)))
    else:
        edge = np.zeros(fa.shape, dtype=bool)
    h_amp, h_shift, h_crop, h_harvest = _hash_uniform(ia, ib, seed, 4)
    del a, b, fa, fb, ia, ib
    parcel_amp = 0.55 + 0.45 * h_amp
    parcel_shift = (h_shift - 0.5) * 0.24
    cereal = h_crop < 0.3  # ~30 % winter cereals, harvested late in the series
    parcel_harvest = np.where(cereal, 0.62 + 0.3 * h_harvest, 9.0).astype(np.float32)

    # water: one lake per tile (kept inside it) and a river across the whole mosaic
    lrng = _rng(seed, "lake", row, col)
    cu, cv = col + lrng.uniform(0.3, 0.7), row + lrng.uniform(0.3, 0.7)
    ra, rb, rot = lrng.uniform(0.08, 0.12), lrng.uniform(0.05, 0.09), lrng.uniform(0, math.pi)
    k1, k2 = int(lrng.integers(2, 4)), int(lrng.integers(4, 7))
    p1, p2 = float(lrng.uniform(0, 6.3)), float(lrng.uniform(0, 6.3))
    du, dv = uu - np.float32(cu), vv - np.float32(cv)
    xr = du * np.float32(math.cos(rot)) + dv * np.float32(math.sin(rot))
    yr = dv * np.float32(math.cos(rot)) - du * np.float32(math.sin(rot))
    rho = np.sqrt((xr / np.float32(ra)) ** 2 + (yr / np.float32(rb)) ** 2)
    ang = np.arctan2(yr, xr)
    shore = 1.0 + 0.15 * np.sin(k1 * ang + p1) + 0.08 * np.sin(k2 * ang + p2)
    lake = rho < shore
    del du, dv, xr, yr, rho, ang, shore
    rrng = _rng(seed, "river")
    river_centre = rows * rrng.uniform(0.55, 0.7)
    rv = (river_centre + 0.08 * np.sin(2 * math.pi * u / 1.3 + rrng.uniform(0, 6.3))
          + 0.025 * np.sin(2 * math.pi * u / 0.37 + rrng.uniform(0, 6.3)))
    river = np.abs(v[:, None] - rv[None, :]) < max(0.006, 1.2 / size)
    water = lake | river
    turbidity = _sigmoid(_field(_waves(_rng(seed, "turbidity"), 8, 2.0, 8.0), u, v) * 2.0)

    soil_brightness = 1.0 + 0.12 * _field(_waves(_rng(seed, "soil"), 12, 1.5, 12.0), u, v)
    texture = _field(_waves(_rng(seed, "texture"), 14, 12.0, 60.0, beta=0.5), u, v)

    nodata_cut = gcols[None, :] < cut_col(params, grows)[:, None]
    land = (~water).astype(np.float32)
    water_turbid = turbidity * (1.0 - land)
    return _Tile(
        row=row, col=col, u=u, v=v,
        forest=forest * land, urban=urban * land, agri=agri * land,
        water=water, water_clear=(1.0 - land) - water_turbid, water_turbid=water_turbid,
        soil_brightness=soil_brightness, urban_brightness=1.0 + 0.15 * texture,
        urban_green=np.clip(0.25 + 0.15 * texture, 0.0, 1.0), texture=texture,
        parcel_amp=parcel_amp.astype(np.float32), parcel_shift=parcel_shift.astype(np.float32),
        parcel_harvest=parcel_harvest, parcel_edge=edge, nodata_cut=nodata_cut,
    )


def _surface(tile: _Tile, tau: float) -> np.ndarray:
    """Surface reflectance (4, H, W) float32 at series position tau in [0, 1].

    Every pixel is a linear mix of six end-member spectra (dry and lush vegetation, soil, impervious surface,
    clear and turbid water); the per-pixel weights carry the landscape and the season, so each band costs only a
    few passes.
    """
    f32 = np.float32
    g_common = f32(_season(tau))
    tex = tile.texture
    # agriculture: per-parcel amplitude and timing; harvested cereal becomes stubble; green field margins
    g_parcel = np.exp(-(((tau - tile.parcel_shift) - _SEASON_PEAK) / f32(_SEASON_WIDTH)) ** 2)
    g_parcel = tile.parcel_amp * (f32(0.3) + f32(0.7) * g_parcel)
    g_parcel[tau >= tile.parcel_harvest] = 0.05
    g_parcel[tile.parcel_edge] = 0.35 + 0.5 * float(g_common)
    fc_agri = np.clip(g_parcel * (1.0 + 0.10 * tex), 0.0, 1.0)
    g_agri = np.clip(g_parcel + 0.1, 0.0, 1.0)
    del g_parcel
    # forest: dense, moderate seasonal swing
    g_forest = np.clip(f32(0.5 + 0.45 * float(g_common)) + f32(0.05) * tex, 0.0, 1.0)
    fc_forest = f32(0.95)
    # built-up: impervious surfaces with some green
    fc_urban = tile.urban_green * f32(0.5 + 0.5 * float(g_common))
    g_urban = f32(0.6 + 0.3 * float(g_common))

    wa, wf, wu = tile.agri * fc_agri, tile.forest * fc_forest, tile.urban * fc_urban
    w_lush = wa * g_agri + wf * g_forest + wu * g_urban
    w_dry = wa + wf + wu - w_lush
    w_soil = (tile.agri * (1.0 - fc_agri) + tile.forest * (1.0 - fc_forest)) * tile.soil_brightness
    w_urban = tile.urban * (1.0 - fc_urban) * tile.urban_brightness
    del wa, wf, wu, fc_agri, g_agri, g_forest, fc_urban

    out = np.empty((4,) + tex.shape, dtype=np.float32)
    for i in range(4):
        band = out[i]
        np.multiply(w_lush, _VEG_LUSH[i], out=band)
        band += w_dry * _VEG_DRY[i]
        band += w_soil * _SOIL[i]
        band += w_urban * _URBAN[i]
        band += tile.water_clear * _WATER[i]
        band += tile.water_turbid * _WATER_TURBID[i]
    return out


def cloud_schedule(params: SampleParams) -> list[dict[str, Any]]:
    """Per date: target fraction of opaque cloud and of cirrus, and the field parameters."""
    n = params["n_dates"]
    rng = _rng(params["seed"], "schedule")
    totals = rng.uniform(0.0, 0.28, n)
    if n >= 2:
        n_cloudy = max(1, round(n / 4))
        cloudy = rng.choice(n, size=n_cloudy, replace=False)
        totals[cloudy] = rng.uniform(0.6, 0.85, n_cloudy)
    cirrus_on = rng.random(n) < 0.5
    schedule: list[dict[str, Any]] = []
    for d in range(n):
        total = float(totals[d])
        crng = _rng(params["seed"], "cloud", d)
        cloud = _waves(crng, 16, 1.0, 7.0, beta=0.9)
        cirrus = _waves(_rng(params["seed"], "cirrus", d), 10, 2.0, 9.0, beta=0.7,
                        direction=float(crng.uniform(0, math.pi)), spread=0.5)
        schedule.append({
            "opaque": total * (0.8 if cirrus_on[d] else 1.0),
            "cirrus": total * 0.35 if cirrus_on[d] else 0.0,
            "cloud_waves": cloud,
            "cirrus_waves": cirrus,
        })
    # thresholds from a coarse grid over the whole mosaic, so that tiles agree along their seams
    rows, cols = params["tiles"]
    nu = min(cols * params["size"], 256)
    nv = min(rows * params["size"], 256)
    cu = (np.arange(nu) + 0.5) / nu * cols
    cv = (np.arange(nv) + 0.5) / nv * rows
    for s in schedule:
        s["cloud_threshold"] = _threshold(_field(s["cloud_waves"], cu, cv), s["opaque"])
        s["cirrus_threshold"] = _threshold(_field(s["cirrus_waves"], cu, cv), s["cirrus"])
    return schedule


def _threshold(values: np.ndarray, fraction: float) -> float:
    if fraction <= 0.0:
        return math.inf
    return float(np.quantile(values.astype(np.float64), 1.0 - min(fraction, 1.0)))


def render_tile(params: SampleParams, tile: _Tile, date_index: int, schedule: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Reflectance DN (4, H, W) uint16 and SCL (H, W) uint8 of one tile on one date."""
    n = params["n_dates"]
    tau = date_index / (n - 1) if n > 1 else 0.0
    refl = _surface(tile, tau)

    ndvi = (refl[2] - refl[0]) / np.maximum(refl[2] + refl[0], np.float32(1e-6))
    scl = np.where(tile.water, np.uint8(6), np.where(ndvi > _NDVI_VEGETATION, np.uint8(4), np.uint8(5)))
    del ndvi

    # clouds, their shadows and cirrus
    cloud = _field(schedule["cloud_waves"], tile.u, tile.v) - np.float32(schedule["cloud_threshold"])
    su = _SHADOW_DISTANCE * math.sin(_SHADOW_AZIMUTH)  # east component
    sv = -_SHADOW_DISTANCE * math.cos(_SHADOW_AZIMUTH)  # rows grow southwards
    shadow = _field(schedule["cloud_waves"], tile.u - su, tile.v - sv) > np.float32(schedule["cloud_threshold"])
    opaque = cloud > 0
    shadow &= ~opaque
    cirrus_t = _field(schedule["cirrus_waves"], tile.u, tile.v) - np.float32(schedule["cirrus_threshold"])
    cirrus = cirrus_t > 0

    refl *= np.where(shadow, _SHADOW_FACTOR, np.float32(1.0))
    scl[shadow] = 3
    if cirrus.any():
        alpha_c = np.clip(np.float32(0.12) + np.float32(0.35) * cirrus_t, 0.0, 0.4) * cirrus
        for i in range(4):
            refl[i] += alpha_c * (_CIRRUS[i] - refl[i])
        scl[cirrus] = 10
    if opaque.any():
        alpha = np.clip(np.float32(0.55) + np.float32(0.9) * cloud, 0.0, 1.0) * opaque
        for i in range(4):
            refl[i] += alpha * (_CLOUD[i] * (0.9 + 0.1 * alpha) - refl[i])
        scl[opaque] = np.where(cloud[opaque] > 0.45, np.uint8(9), np.uint8(8))
    del cloud, shadow, opaque, cirrus_t, cirrus

    # sensor noise, conversion to DN (L2A baseline >= 04.00: DN = (reflectance + 0.1) / 0.0001)
    # (one noise sequence, read at a different offset for each band: a quarter of the random draws)
    npix = refl[0].size
    noise = _rng(params["seed"], "noise", date_index, tile.row, tile.col).standard_normal(
        npix + 3 * _NOISE_STRIDE, dtype=np.float32)
    noise *= _NOISE_SIGMA
    dn = np.empty(refl.shape, dtype=np.uint16)
    for i in range(4):
        band = refl[i]
        band += noise[i * _NOISE_STRIDE: i * _NOISE_STRIDE + npix].reshape(band.shape)
        band -= np.float32(OFFSET)
        band /= np.float32(SCALE)
        np.rint(band, out=band)
        np.clip(band, 1, 65535, out=band)
        dn[i] = band
    if has_swath_edge(date_index):
        dn[:, tile.nodata_cut] = 0
        scl[tile.nodata_cut] = 0
    return dn, scl.astype(np.uint8, copy=False)
