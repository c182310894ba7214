"""``rasterflow.open(spec)`` (issue 30, item 4): the planned job as a lazy xarray Dataset, computed equal to what
``rasterflow run`` writes, bit for bit, with the same variables, coordinates and attributes; nothing read until
computed; a selection computes only the chunks it needs."""

from __future__ import annotations

import numpy as np
import xarray as xr
from dask.callbacks import Callback

import rasterflow


class _Tasks(Callback):
    """The chunk tasks (reads) Dask runs while a computation is within the ``with``."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list = []

    def _pretask(self, key, dsk, state):  # noqa: D401 - Dask's callback signature
        name = key[0] if isinstance(key, tuple) else str(key)
        if name.startswith(("rasterflow-bands", "rasterflow-median")):
            self.keys.append(key)


def test_open_equals_the_run_bit_for_bit_and_reads_nothing_before_compute(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median, period: month}", output="out/open.zarr",
                      chunks="{time: -1, y: 128, x: 128}")
    with _Tasks() as seen:
        ds = rasterflow.open(spec)
    assert seen.keys == []  # opening plans only
    result = rasterflow.run(spec, state_dir=tmp_path / "state")
    assert result.ok
    with xr.open_zarr(tmp_path / "out" / "open.zarr") as written:
        assert sorted(ds.data_vars) == sorted(written.data_vars)
        assert list(ds["period"].values) == list(written["period"].values)
        assert list(ds["period_label"].values) == list(written["period_label"].values)
        np.testing.assert_array_equal(ds["x"].values, written["x"].values)
        for key in ("rasterflow_method", "rasterflow_period", "rasterflow_item_count", "rasterflow_pipeline"):
            assert ds.attrs[key] == written.attrs[key], key
        with _Tasks() as seen:
            computed = ds.compute()
        assert len(seen.keys) == 4  # 256² in 128² chunks
        np.testing.assert_array_equal(computed["ndvi"].values, written["ndvi"].values)


def test_a_selection_computes_only_the_chunks_it_needs(write_spec, sample):
    spec = write_spec(output="out/series.zarr", chunks="{time: 1, y: 128, x: 128}")  # a time series, no reduce
    ds = rasterflow.open(spec)
    assert ds["ndvi"].dims == ("time", "y", "x") and ds.sizes["time"] >= 4
    with _Tasks() as seen:
        first = ds["ndvi"].isel(time=0, x=slice(0, 100)).compute()
    assert len(seen.keys) == 2  # one date, the two chunks of the left column
    with _Tasks() as seen:
        whole = ds["ndvi"].isel(time=0).compute()
    assert len(seen.keys) == 4
    np.testing.assert_array_equal(first.values, whole.values[:, :100])
    from reference import load_items, masked_ndvi

    items = load_items(sample)
    expected = masked_ndvi(items[:1])[0]
    assert str(ds["time"].values[0])[:19] == items[0]["properties"]["datetime"][:19]
    np.testing.assert_array_equal(whole.values, expected)
