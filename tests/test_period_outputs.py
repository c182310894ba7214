"""Periods in the output (issue 29, item 4): dekads, ISO 8601 durations and explicit intervals; every period of the
window is in the output (one without an item: NaN, count 0), the ``period`` coordinate holds each period's start as
a datetime, ``period_end`` its exclusive end and ``period_label`` the label files are named by; values equal NumPy
over the items of each period."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from reference import assert_same, load_items, masked_ndvi, reduce_reference

WINDOW = (dt.datetime(2024, 6, 1), dt.datetime(2024, 9, 1))  # the sample specs' 2024-06-01/2024-08-31


def _dekads() -> list[tuple[dt.datetime, dt.datetime]]:
    out = []
    for month in (6, 7, 8):
        first = dt.datetime(2024, month, 1)
        after = dt.datetime(2024, month + 1, 1)
        out += [(first, first.replace(day=11)), (first.replace(day=11), first.replace(day=21)),
                (first.replace(day=21), after)]
    return out


def _days(n: int) -> list[tuple[dt.datetime, dt.datetime]]:
    out, start = [], WINDOW[0]
    while start < WINDOW[1]:
        out.append((start, start + dt.timedelta(days=n)))
        start += dt.timedelta(days=n)
    return out


INTERVALS = [(dt.datetime(2024, 6, 1), dt.datetime(2024, 7, 1)), (dt.datetime(2024, 7, 15), dt.datetime(2024, 8, 15)),
             (dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 2))]  # a gap, and one outside the window: empty


@pytest.mark.parametrize("period,expected", [
    ("dekad", _dekads()),
    ("P16D", _days(16)),
    ("[[2024-06-01, 2024-06-30], '2024-07-15/2024-08-14', [2025-01-01, 2025-01-01]]", INTERVALS),
])
def test_every_period_of_the_window_with_datetime_coordinates(write_spec, sample, tmp_path, period, expected):
    spec = write_spec(reduce=f"[{{method: median, period: {period}}}, {{method: count}}]", output="out/p.zarr")
    result = CliRunner().invoke(cli, ["run", str(spec)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "p.zarr.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    series = masked_ndvi(items)
    times = np.array([np.datetime64(i["properties"]["datetime"].replace("Z", "")) for i in items])
    with xr.open_zarr(tmp_path / "out" / "p.zarr") as ds:
        starts = [np.datetime64(a, "ns") for a, _ in expected]
        ends = [np.datetime64(b, "ns") for _, b in expected]
        assert list(ds["period"].values) == starts
        assert list(ds["period_end"].values) == ends
        assert len(set(ds["period_label"].values)) == len(expected)
        empty = 0
        for p, (start, end) in enumerate(zip(starts, ends)):
            inside = (times >= start) & (times < end)
            median, count = ds["ndvi_median"].isel(period=p).values, ds["ndvi_count"].isel(period=p).values
            if not inside.any():
                empty += 1
                assert np.isnan(median).all() and (count == 0).all()
                continue
            np.testing.assert_array_equal(count, (~np.isnan(series[inside])).sum(axis=0))
            if np.isfinite(reduce_reference(series[inside], "median")).mean() > 0.5:
                assert_same(median, reduce_reference(series[inside], "median"))
        assert empty >= 1  # the sample's 8 dates leave periods empty: they are in the output all the same


@pytest.mark.parametrize("period,words", [
    ("P0D", "P0D is not a period length"),
    ("PT12H", "time-of-day part"),
    ("fortnight", "use month, season, year, dekad"),
    ("[[2024-06-01, 2024-06-20], [2024-06-15, 2024-06-30]]", "overlap"),
])
def test_a_period_that_does_not_parse_is_refused_with_its_line(sample, tmp_path, period, words):
    from conftest import spec_text

    text = spec_text(sample, reduce=f"{{method: median, period: {period}}}")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if t.startswith("reduce:"))
    assert f"bad.yaml:{line}" in result.output and "reduce.period" in result.output, result.output
    assert words in result.output, result.output
