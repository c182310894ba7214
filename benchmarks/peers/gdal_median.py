"""The GDAL peer: the masked NDVI median streamed by GDAL alone, one process, no Dask, no NumPy on pixels.

    GDAL_PYTHON ITEMS_JSON OUTPUT_TIF

Runs with the Python of the GDAL venv (``gdal-wheel`` 3.13 from PyPI: wheels for CPython >= 3.12 only, and a GDAL
other than the one inside rasterio's wheel, so its own venv; ``compare_peers.py --gdal-python`` / ``$GDAL_PYTHON``).
That wheel ships the bindings and the Python utilities but no ``gdal`` executable and no muparser/ExprTk (``gdal
raster calc``'s default expression dialect is refused), so the job is written with VRT *builtin* pixel functions,
as a GDAL user without muparser would:

* per date, ``mask_K.vrt``: ``reclassify`` of SCL (0, 3, 8, 9, 10 -> NoData (NaN), anything else -> 1);
  ``ndvi_K.vrt``: ``norm_diff`` of nir and red, each a ComplexSource with the ``raster:bands`` scale and offset and
  NoData 0; ``masked_K.vrt``: ``mul`` of the two with ``propagateNoData``;
* ``stack.vrt``: the 8 masked dates as 8 bands;
* ``gdal raster calc --dialect builtin --calc median --flatten`` (through ``osgeo.gdal.Run``, the algorithm the
  ``gdal`` CLI runs) -> a ZSTD COG of 512² tiles without overviews (the other variants write no overviews either).

GDAL evaluates the pixel functions in double precision (the others in float32), hence differences of a few 1e-7.
Prints one JSON line: job seconds and the GDAL version.
"""

import json
import os
import sys
import time
from xml.sax.saxutils import escape

from osgeo import gdal

gdal.UseExceptions()

DROP = (0, 3, 8, 9, 10)  # SCL nodata, cloud shadow, cloud medium/high, cirrus


def main(items_json: str, output: str) -> None:
    started = time.perf_counter()
    items = json.loads(open(items_json).read())["features"]
    items.sort(key=lambda item: (item["properties"]["datetime"], item["id"]))
    first = gdal.Open(items[0]["assets"]["red"]["href"])
    width, height = first.RasterXSize, first.RasterYSize
    transform, srs = first.GetGeoTransform(), first.GetProjection()
    first = None
    work = output + ".vrt.d"
    os.makedirs(work, exist_ok=True)

    def dataset(bands: str) -> str:
        return (f'<VRTDataset rasterXSize="{width}" rasterYSize="{height}"><SRS>{escape(srs)}</SRS>'
                f'<GeoTransform>{", ".join(map(repr, transform))}</GeoTransform>{bands}</VRTDataset>')

    def source(path: str, kind: str = "SimpleSource", scale=None, offset=None, nodata=None) -> str:
        extra = "" if nodata is None else f"<NODATA>{nodata}</NODATA>"
        if scale is not None:
            extra += f"<ScaleOffset>{offset!r}</ScaleOffset><ScaleRatio>{scale!r}</ScaleRatio>"
        rect = f'xOff="0" yOff="0" xSize="{width}" ySize="{height}"'
        return (f'<{kind}><SourceFilename relativeToVRT="0">{escape(path)}</SourceFilename><SourceBand>1</SourceBand>'
                f"<SrcRect {rect}/><DstRect {rect}/>{extra}</{kind}>")

    def derived(function: str, sources: list[str], arguments: str = "") -> str:
        return ('<VRTRasterBand dataType="Float32" band="1" subClass="VRTDerivedRasterBand">'
                f"<NoDataValue>nan</NoDataValue><PixelFunctionType>{function}</PixelFunctionType>"
                f"{arguments}<SourceTransferType>Float32</SourceTransferType>{''.join(sources)}</VRTRasterBand>")

    def write(path: str, text: str) -> str:
        with open(path, "w") as f:
            f.write(text)
        return path

    mapping = ";".join(f"{c}=NO_DATA" for c in DROP) + ";DEFAULT=1"
    masked = []
    for k, item in enumerate(items):
        assets = item["assets"]
        band = assets["red"]["raster:bands"][0]
        scale, offset = band["scale"], band["offset"]
        nir_band = assets["nir"]["raster:bands"][0]
        if (nir_band["scale"], nir_band["offset"]) != (scale, offset):
            raise SystemExit(f"{item['id']}: red and nir differ in scale/offset; this script assumes they do not")
        mask = write(f"{work}/mask_{k}.vrt", dataset(derived(
            "reclassify", [source(assets["scl"]["href"])], f'<PixelFunctionArguments mapping="{mapping}"/>')))
        ndvi = write(f"{work}/ndvi_{k}.vrt", dataset(derived("norm_diff", [
            source(assets["nir"]["href"], "ComplexSource", scale, offset, 0),
            source(assets["red"]["href"], "ComplexSource", scale, offset, 0)])))
        masked.append(write(f"{work}/masked_{k}.vrt", dataset(derived(
            "mul", [source(ndvi), source(mask)], '<PixelFunctionArguments propagateNoData="true"/>'))))
    stack = write(f"{work}/stack.vrt", dataset("".join(
        f'<VRTRasterBand dataType="Float32" band="{i + 1}"><NoDataValue>nan</NoDataValue>{source(path)}'
        "</VRTRasterBand>" for i, path in enumerate(masked))))
    gdal.Run("raster", "calc", input=[stack], calc=["median"], dialect="builtin", flatten=True, output=output,
             output_format="COG", output_data_type="Float32", overwrite=True, quiet=True,
             creation_option=["COMPRESS=ZSTD", "BLOCKSIZE=512", "NUM_THREADS=2", "OVERVIEWS=NONE"]).Finalize()
    print(json.dumps({"job_seconds": time.perf_counter() - started, "gdal": gdal.__version__,
                      "gdal_cachemax": gdal.GetCacheMax(), "workers": [], "transfer_bytes": 0}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
