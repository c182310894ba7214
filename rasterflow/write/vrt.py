"""A GDAL VRT mosaic of the tiles of a tiled COG output, for viewing the tiles as one raster.

The XML follows GDAL's VRT format (https://gdal.org/en/stable/drivers/raster/vrt.html): a ``VRTDataset`` of the
whole grid (``SRS``, ``GeoTransform``), one ``VRTRasterBand`` per output band (data type, ``NoDataValue``, ``Scale``
/``Offset`` and the band name as ``Description``), and in each band one ``SimpleSource`` per tile file: its band,
``SourceProperties`` (size, data type, block size, so GDAL need not open every tile to open the mosaic),
``SrcRect`` (the whole tile) and ``DstRect`` (where it lies on the grid). Tiles do not overlap, so simple sources
suffice; pixels of tiles that were not written read as the band's nodata. Source paths are relative to the VRT
(``relativeToVRT="1"``), so the mosaic and its tile folder can be moved together. GDAL uses the tiles' own overviews
when the mosaic is read at a reduced resolution (implicit overviews of VRTs of simple sources).

Stdlib only: the XML is written with :mod:`xml.etree.ElementTree` (no GDAL Python bindings needed); the CRS as WKT
comes from pyproj.
"""

from __future__ import annotations

import math
import os
import posixpath
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

from rasterflow.write.common import is_remote

__all__ = ["VrtSource", "GDAL_DATA_TYPES", "vrt_text", "relative_href"]

GDAL_DATA_TYPES = {
    "uint8": "Byte", "int8": "Int8", "uint16": "UInt16", "int16": "Int16", "uint32": "UInt32", "int32": "Int32",
    "float32": "Float32", "float64": "Float64",
}
"""NumPy dtype name -> GDAL data type name (``dataType`` of a VRT band)."""


@dataclass(frozen=True)
class VrtSource:
    """One tile file of the mosaic: where it is and where it lies on the grid."""

    path: str
    row: int
    """First grid row of the tile."""
    col: int
    """First grid column of the tile."""
    height: int
    width: int
    block: tuple[int, int] = (512, 512)
    """The file's internal tile (block) height and width."""


def relative_href(path: str, vrt_path: str) -> str:
    """``path`` relative to the folder of ``vrt_path`` (both local, or both URLs of one scheme and bucket)."""
    if is_remote(path) or is_remote(vrt_path):
        scheme, _, rest = str(path).partition("://")
        vscheme, _, vrest = str(vrt_path).partition("://")
        if scheme != vscheme or rest.split("/", 1)[0] != vrest.split("/", 1)[0]:
            raise ValueError(f"{path} and {vrt_path} are not on one filesystem; a VRT mosaic needs them together")
        return posixpath.relpath(rest, posixpath.dirname(vrest))
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(vrt_path))).replace(os.sep, "/")


def _number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def vrt_text(vrt_path: str, *, width: int, height: int, crs: str, transform: Sequence[float], dtype: str,
             band_names: Sequence[str], sources: Sequence[VrtSource], nodata: float | None = None,
             scale: float = 1.0, offset: float = 0.0) -> str:
    """The VRT XML of a mosaic of non-overlapping tile files onto one grid.

    Parameters
    ----------
    vrt_path : str
        Where the VRT will be written (source paths are made relative to its folder).
    width, height : int
        The grid's size in pixels.
    crs : str
        The grid's CRS (``EPSG:32633``), written as WKT.
    transform : sequence of float
        The grid's affine ``(a, b, c, d, e, f)`` (rasterio / ``affine`` order).
    dtype : str
        The stored data type of every tile (a NumPy name: ``float32``, ``int16``...).
    band_names : sequence of str
        One band per name, in the tiles' band order.
    sources : sequence of VrtSource
        The tile files; each has every band.
    nodata : float, optional
        The stored nodata value (NaN allowed); also what pixels without a tile read as.
    scale, offset : float
        Physical value = stored * scale + offset (GDAL's band ``Scale`` / ``Offset``).
    """
    from pyproj import CRS

    if dtype not in GDAL_DATA_TYPES:
        raise ValueError(f"no GDAL data type for {dtype!r}; expected one of {', '.join(GDAL_DATA_TYPES)}")
    a, b, c, d, e, f = (float(v) for v in transform[:6])
    root = ET.Element("VRTDataset", rasterXSize=str(int(width)), rasterYSize=str(int(height)))
    srs = ET.SubElement(root, "SRS", dataAxisToSRSAxisMapping="1,2")
    srs.text = CRS.from_user_input(crs).to_wkt()
    ET.SubElement(root, "GeoTransform").text = ", ".join(repr(v) for v in (c, a, b, f, d, e))
    gdal_type = GDAL_DATA_TYPES[dtype]
    hrefs = [relative_href(s.path, vrt_path) for s in sources]
    for band, name in enumerate(band_names, start=1):
        element = ET.SubElement(root, "VRTRasterBand", dataType=gdal_type, band=str(band))
        ET.SubElement(element, "Description").text = str(name)
        if nodata is not None:
            ET.SubElement(element, "NoDataValue").text = _number(float(nodata))
        if scale != 1.0 or offset != 0.0:
            ET.SubElement(element, "Offset").text = repr(float(offset))
            ET.SubElement(element, "Scale").text = repr(float(scale))
        for source, href in zip(sources, hrefs):
            simple = ET.SubElement(element, "SimpleSource")
            ET.SubElement(simple, "SourceFilename", relativeToVRT="1").text = href
            ET.SubElement(simple, "SourceBand").text = str(band)
            ET.SubElement(simple, "SourceProperties", RasterXSize=str(source.width), RasterYSize=str(source.height),
                          DataType=gdal_type, BlockXSize=str(source.block[1]), BlockYSize=str(source.block[0]))
            ET.SubElement(simple, "SrcRect", xOff="0", yOff="0", xSize=str(source.width), ySize=str(source.height))
            ET.SubElement(simple, "DstRect", xOff=str(source.col), yOff=str(source.row), xSize=str(source.width),
                          ySize=str(source.height))
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"
