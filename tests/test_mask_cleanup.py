"""``mask_cleanup`` (issue 30, item 2): each date's mask opened and dilated with disks (scipy.ndimage), the chunks
read with a halo so the result does not depend on the chunk layout (chunks of 64 and 256 give identical outputs),
equal to scipy's disk opening + dilation of the whole image away from the grid's edge; the budget counts the halo;
the spec errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner
from scipy import ndimage

from rasterflow.cli import cli
from reference import load_items, read_asset_stack

CLEANUP = "\nmask_cleanup: [{opening: 2}, {dilation: 5}]\n"


def _disk(radius: int) -> np.ndarray:
    y, x = np.ogrid[-radius:radius + 1, -radius:radius + 1]
    return x * x + y * y <= radius * radius


def _run(sample, tmp_path, chunk: int, name: str) -> np.ndarray:
    from conftest import spec_text

    text = spec_text(sample, output=f"out/{name}.zarr", chunks=f"{{time: -1, y: {chunk}, x: {chunk}}}",
                     bands='{nir_out: "nir * 1"}', extra=CLEANUP)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["run", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with xr.open_zarr(tmp_path / "out" / f"{name}.zarr") as ds:
        return ds["nir_out"].values


def test_cleanup_does_not_depend_on_the_chunks_and_equals_scipy_on_the_whole_image(sample, tmp_path):
    small = _run(sample, tmp_path, 64, "small")
    large = _run(sample, tmp_path, 256, "large")
    np.testing.assert_array_equal(small, large)  # the halo: chunk edges change nothing
    report = json.loads((tmp_path / "out" / "small.zarr.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    scl = read_asset_stack(items, "scl")
    nir = read_asset_stack(items, "nir")
    series = np.empty_like(nir)
    changed = 0
    for t in range(len(items)):
        raw = np.isin(scl[t], (3, 8, 9, 10))
        cleaned = ndimage.binary_dilation(ndimage.binary_opening(raw, structure=_disk(2)), structure=_disk(5))
        changed += int((cleaned != raw).sum())
        series[t] = np.where(cleaned, np.nan, nir[t])
    assert changed > 1000  # the cleanup does something on this sample
    # no reduce: the output is the series; compare away from the grid's edge (the whole-image reference has no
    # halo there either, but scipy's border treats outside as unmasked the same way)
    edge = 2 * 2 + 5
    np.testing.assert_array_equal(small[:, edge:-edge, edge:-edge], series[:, edge:-edge, edge:-edge])
    np.testing.assert_array_equal(small, series)


def test_the_budget_counts_the_halo(sample, tmp_path):
    from conftest import spec_text

    peaks = []
    for extra in ("", CLEANUP):
        path = tmp_path / "p.yaml"
        path.write_text(spec_text(sample, reduce="{method: median}", chunks="{time: -1, y: 128, x: 128}",
                                  extra=extra))
        planned = CliRunner().invoke(cli, ["plan", "--json", str(path)])
        assert planned.exit_code == 0, planned.output
        peaks.append(json.loads(planned.output)["budget"]["peak_task_bytes"])
    assert peaks[1] > peaks[0] * ((128 + 2 * 9) / 128) ** 2 * 0.95


@pytest.mark.parametrize("cleanup,words", [
    ("[{opening: 0}]", "greater than 0"),
    ("[{opening: 2, dilation: 3}]", "each step is one of"),
    ("[{smoothing: 2}]", "smoothing"),
])
def test_bad_cleanup_is_refused_with_its_line(sample, tmp_path, cleanup, words):
    from conftest import spec_text

    text = spec_text(sample, extra=f"\nmask_cleanup: {cleanup}\n")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if t.startswith("mask_cleanup:"))
    assert f"bad.yaml:{line}" in result.output and words in result.output, result.output


def test_cleanup_without_a_mask_is_refused(sample, tmp_path):
    from conftest import spec_text

    path = tmp_path / "bad.yaml"
    path.write_text(spec_text(sample, mask=None, extra=CLEANUP))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "mask_cleanup cleans the mask" in result.output, result.output


def test_the_tasks_and_the_budget_take_one_halo(sample, tmp_path):
    """The halo the tasks read (the plan's program) and the one the budget counts come from one rule
    (``Spec.cleanup_halo``): an opening or a closing reaches twice its radius, a dilation or an erosion once."""
    from conftest import spec_text

    from rasterflow import budget
    from rasterflow.commands import plan_with_items, search
    from rasterflow.planning import local_layout
    from rasterflow.spec import load_spec

    path = tmp_path / "halo.yaml"
    path.write_text(spec_text(sample, reduce="{method: median}",
                              extra="\nmask_cleanup: [{opening: 2}, {dilation: 3}, {closing: 1}, {erosion: 1}]\n"))
    loaded = load_spec(path)
    plan = plan_with_items(loaded, search(loaded), local_layout(loaded.spec))
    assert plan.program.halo == budget.pipeline_shape(loaded.spec).halo == 2 * 2 + 3 + 2 * 1 + 1
