"""An area of interest (issue 30, item 3): ``source.stac.intersects`` (inline GeoJSON or a file) searches with it,
gives the grid when ``grid.bounds`` is absent, clips the output (pixels outside nodata, inside identical to the
bbox run), skips the chunks outside (their tasks read nothing), and the STAC Item carries the clipped footprint;
invalid geometries are refused with the line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import rasterflow
from rasterflow.cli import cli


def _triangle(sample) -> dict:
    """A triangle over the lower-left half of the sample's tile (WGS84)."""
    west, south, east, north = sample.bbox_wgs84
    return {"type": "Polygon", "coordinates": [[[west, south], [east, south], [west, north], [west, south]]]}


def _spec(sample, tmp_path, name: str, area: str | None) -> str:
    from conftest import spec_text

    text = spec_text(sample, reduce="{method: median}", output=f"out/{name}.zarr", chunks="{time: -1, y: 64, x: 64}")
    if area is not None:
        text = "\n".join(line for line in text.splitlines() if not line.startswith("    bbox:"))
        text = text.replace("    datetime:", f"    intersects: {area}\n    datetime:")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text + "\n")
    return str(path)


def test_a_polygon_clips_the_output_and_skips_the_chunks_outside(sample, tmp_path):
    geojson = tmp_path / "aoi.geojson"
    geojson.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {}, "geometry": _triangle(sample)}]}))
    clipped = _spec(sample, tmp_path, "aoi", "aoi.geojson")  # a file, relative to the spec
    full = _spec(sample, tmp_path, "bbox", None)
    plan = rasterflow.plan(clipped)
    assert plan.outside_chunks and len(plan.outside_chunks) < 16  # 4 x 4 chunks of 64 px: some outside, not all
    # an outside chunk's task reads nothing
    from rasterflow import graph
    from rasterflow.write.submit import BlockTasks

    dataset = graph.build_dataset(plan)
    array = dataset["ndvi"].data
    i, j = sorted(plan.outside_chunks)[-1]
    node = BlockTasks([array])([(array.name, i, j)]).roots[0]
    jobs = [a for a in node.args[0].args if type(a).__name__ == "ReadJob"] if hasattr(node.args[0], "args") else []
    assert jobs and all(len(job.reads) == 0 for job in jobs)
    for spec in (clipped, full):
        result = CliRunner().invoke(cli, ["run", spec], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    with xr.open_zarr(tmp_path / "out" / "aoi.zarr") as a, xr.open_zarr(tmp_path / "out" / "bbox.zarr") as b:
        inside_grid = a["ndvi"].values
        reference = b["ndvi"].sel(x=a["x"], y=a["y"]).values  # the AOI's grid lies on the bbox run's pixels
    from rasterflow.aoi import outside, project

    transform = tuple(plan.grid.transform)
    out = outside(project(_triangle(sample), plan.grid.crs), transform, plan.grid.shape)
    assert 0.2 < out.mean() < 0.8
    assert np.isnan(inside_grid[out]).all()
    np.testing.assert_array_equal(inside_grid[~out], reference[~out])
    item = json.loads((tmp_path / "out" / "aoi.zarr.stac-item.json").read_text())
    from shapely.geometry import shape

    assert shape(item["geometry"]).within(shape(_triangle(sample)).buffer(1e-9))


def test_without_grid_bounds_the_grid_is_the_polygons(sample, tmp_path):
    import re

    path = _spec(sample, tmp_path, "derived", json.dumps(_triangle(sample)))
    text = re.sub(r"\n  bounds: \[[^\]]*\]", "", open(path).read())
    open(path, "w").write(text)
    plan = rasterflow.plan(path)
    from shapely.geometry import shape

    from rasterflow.aoi import project

    minx, miny, maxx, maxy = shape(project(_triangle(sample), plan.grid.crs)).bounds
    gminx, gminy, gmaxx, gmaxy = plan.grid.bounds
    # the polygon's lon/lat bounds projected (a rectangle in degrees is a little wider in UTM), snapped outwards
    assert gminx <= minx and maxx <= gmaxx and gminy <= miny and maxy <= gmaxy
    assert (gmaxx - gminx) < 1.1 * (maxx - minx) and (gmaxy - gminy) < 1.1 * (maxy - miny)


@pytest.mark.parametrize("area,words", [
    ('{type: Polygon, coordinates: [[[13.2, 52.5], [13.3, 52.6], [13.3, 52.5], [13.2, 52.6], [13.2, 52.5]]]}',
     "not a valid polygon"),
    ("{type: Point, coordinates: [13.2, 52.5]}", "Polygon or MultiPolygon, not a Point"),
    ("missing.geojson", "cannot read the GeoJSON file"),
])
def test_a_bad_area_is_refused_with_its_line(sample, tmp_path, area, words):
    path = _spec(sample, tmp_path, "bad", area)
    result = CliRunner().invoke(cli, ["validate", path])
    assert result.exit_code == 2, result.output
    assert "source.stac.intersects" in result.output and words in result.output, result.output
    line = next(i for i, t in enumerate(open(path).read().splitlines(), start=1) if "intersects:" in t)
    assert f"bad.yaml:{line}" in result.output, result.output


def test_a_polygon_that_meets_no_item_finds_none(sample, tmp_path):
    far = '{type: Polygon, coordinates: [[[0, 0], [0.1, 0], [0.1, 0.1], [0, 0.1], [0, 0]]]}'
    result = CliRunner().invoke(cli, ["run", _spec(sample, tmp_path, "far", far)])
    assert result.exit_code == 1 and "no items" in result.output.lower(), result.output
