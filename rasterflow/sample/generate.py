"""Generation of a sample: the parameters checked, a complete matching sample reused, else the scenes rendered tile
by tile and date by date, their COGs written by a small thread pool while the next date renders, then the STAC
documents and the manifest. NumPy at import; rasterio, pyproj and filelock when a sample is generated.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rasterflow.sample.files import (
    MANIFEST,
    SampleCatalog,
    catalog_from_manifest,
    cog_compression,
    load_if_complete,
    sample_lock,
    remove_previous,
    write_cog,
    write_json,
    write_text,
    writer_threads,
)
from rasterflow.sample.grid import (
    ASSETS,
    CRS,
    EPSG,
    REFLECTANCE_ASSETS,
    RESOLUTION,
    X0,
    Y0,
    SampleParams,
    check_params,
    has_swath_edge,
    item_plan,
    tile_bounds,
)
from rasterflow.sample.items import (
    collection_dict,
    tile_footprint,
    item_dict,
    scl_statistics,
    ring_to_wgs84,
)
from rasterflow.sample.scene import cloud_schedule, make_tile, render_tile

__all__ = ["generate_sample"]


def generate_sample(
    directory: str | os.PathLike[str],
    *,
    size: int = 1024,
    n_dates: int = 8,
    tiles: tuple[int, int] = (1, 1),
    start: str = "2024-06-03",
    every_days: int = 10,
    seed: int = 0,
    blocksize: int = 512,
    overwrite: bool = False,
    compress: str | None = None,
) -> SampleCatalog:
    """Write a synthetic Sentinel-2 L2A-like sample (COGs + STAC) into ``directory`` and describe it.

    One item per date and tile, dates ``start + i * every_days`` at 10:05 UTC. If ``directory`` already holds a
    complete sample made with the same parameters (its ``sample.json`` manifest, written last, matches and every
    file exists), it is returned as is unless ``overwrite=True``. Otherwise the previous sample's files (those its
    manifest lists, plus the item directories about to be written) are replaced; other files are left alone.
    Concurrent calls on the same directory are serialised with a lock file (``.sample.lock``, filelock).

    Parameters
    ----------
    size : pixels per tile side (10 m pixels), >= 16.
    n_dates : number of dates, >= 1.
    tiles : (rows, cols) of adjacent tiles.
    start : first date, ISO ``YYYY-MM-DD``.
    every_days : days between dates, >= 1.
    seed : seed of everything random.
    blocksize : internal COG tile size, a multiple of 16. Overviews are added while the image is larger than one
        block (so a 256-pixel tile needs ``blocksize <= 128`` to get overviews).
    overwrite : regenerate even when a matching sample exists.
    compress : the COGs' codec (``ZSTD``, ``DEFLATE``, ``LZW``...); default ZSTD where this GDAL has it, else DEFLATE.
        Public Sentinel-2 COGs are DEFLATE; the decoder a reader keeps per open file differs (ZSTD ~0.84 MB,
        DEFLATE ~0.27 MB after one 512² tile, measured; benchmarks/README.md).
    """
    params = check_params(size, n_dates, tiles, start, every_days, seed, blocksize)
    if compress is not None:  # in the manifest only when chosen, so samples made before the option still match
        params["compress"] = str(compress).upper()
    directory = Path(directory).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    with sample_lock(directory):
        if not overwrite:
            existing = load_if_complete(directory, params)
            if existing is not None:
                return existing
        remove_previous(directory, params)
        return _generate(directory, params)


def _generate(directory: Path, params: SampleParams) -> SampleCatalog:
    from pyproj import Transformer
    from rasterio.transform import Affine

    to_wgs84 = Transformer.from_crs(EPSG, 4326, always_xy=True)
    size, blocksize = params["size"], params["blocksize"]
    rows, cols = params["tiles"]
    compress = params.get("compress") or cog_compression()
    schedule = cloud_schedule(params)
    plan = item_plan(params)
    collection_href = str(directory / "collection.json")

    items: dict[str, dict[str, Any]] = {}
    tile_bboxes = []
    # GDAL compresses and writes with the GIL released: the COG writes of one date overlap the rendering of the
    # next. At most two dates' arrays are queued, so memory stays bounded.
    pending: list[Future[None]] = []
    with ThreadPoolExecutor(max_workers=writer_threads(), thread_name_prefix="sample-cog") as pool:
        for r in range(rows):
            for c in range(cols):
                tile = make_tile(params, r, c)
                minx, miny, maxx, maxy = tile_bounds(params, r, c)
                transform = Affine(RESOLUTION, 0.0, minx, 0.0, -RESOLUTION, maxy)
                proj_transform = [float(v) for v in tuple(transform)[:6]]
                _, full_bbox = ring_to_wgs84(to_wgs84, tile_footprint(params, r, c, cut=False))
                tile_bboxes.append(full_bbox)
                for item_id, d, date, tr, tc, mgrs in plan:
                    if (tr, tc) != (r, c):
                        continue
                    dn, scl = render_tile(params, tile, d, schedule[d])
                    cut = has_swath_edge(d) and bool((scl == 0).any())
                    item_dir = directory / item_id
                    item_dir.mkdir(parents=True, exist_ok=True)
                    while len(pending) > 2 * len(ASSETS):
                        pending.pop(0).result()
                    for i, key in enumerate(REFLECTANCE_ASSETS):
                        pending.append(pool.submit(write_cog, item_dir / f"{key}.tif", dn[i], transform, blocksize,
                                                   compress, "AVERAGE", ASSETS[key][0]))
                    pending.append(pool.submit(write_cog, item_dir / "scl.tif", scl, transform, blocksize,
                                               compress, "NEAREST", "SCL"))
                    geometry, bbox = ring_to_wgs84(to_wgs84, tile_footprint(params, r, c, cut=cut))
                    items[item_id] = item_dict(
                        item_id=item_id, date=date, date_index=d, mgrs=mgrs, geometry=geometry, bbox=bbox,
                        bounds=(minx, miny, maxx, maxy), transform=proj_transform, size=size, item_dir=item_dir,
                        stats=scl_statistics(scl), collection_href=collection_href,
                    )
                    del dn, scl
                del tile
        for fut in pending:
            fut.result()

    ordered = [items[item_id] for item_id, *_ in plan]
    bbox_wgs84 = (
        min(b[0] for b in tile_bboxes + [i["bbox"] for i in ordered]),
        min(b[1] for b in tile_bboxes + [i["bbox"] for i in ordered]),
        max(b[2] for b in tile_bboxes + [i["bbox"] for i in ordered]),
        max(b[3] for b in tile_bboxes + [i["bbox"] for i in ordered]),
    )
    bounds = (X0, Y0 - rows * size * RESOLUTION, X0 + cols * size * RESOLUTION, Y0)

    write_json(directory / "items.json", {"type": "FeatureCollection", "features": ordered}, indent=1)
    write_text(directory / "items.ndjson",
                "".join(json.dumps(item, separators=(",", ":")) + "\n" for item in ordered))
    write_json(directory / "collection.json", collection_dict(ordered, bbox_wgs84, collection_href), indent=2)
    manifest = {
        "generator": "rasterflow.sample",
        "params": params,
        "directory": str(directory),
        "compression": compress,
        "item_ids": [i["id"] for i in ordered],
        "crs": CRS,
        "bounds": list(bounds),
        "bbox_wgs84": list(bbox_wgs84),
    }
    write_json(directory / MANIFEST, manifest, indent=2)  # last: marks the sample complete
    return catalog_from_manifest(directory, manifest)
