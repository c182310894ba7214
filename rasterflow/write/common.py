"""The names the writers and the orchestrator share, gathered in one import (each lives in a module with one job).

* :mod:`rasterflow.write.result`: :class:`WriteResult`, what a writer produced;
* :mod:`rasterflow.write.files`: local paths and fsspec URLs (exists, remove, size) and the verified upload;
* :mod:`rasterflow.atomic`: :func:`publish`, moving a finished local file into place;
* :mod:`rasterflow.write.zarrstate`: a Zarr store's rasterflow attributes and its staging path;
* :mod:`rasterflow.write.naming`: the output's dimensions and the file names of a COG output;
* :mod:`rasterflow.write.preflight`: the pre-flight output check;
* :mod:`rasterflow.write.encoding`: compression names and the stored encoding (dtype, scale, offset, nodata).

Every one of them is light on purpose (stdlib only at import time; fsspec, numpy and zarr load inside the
functions that need them), so the orchestrator can check the output target before it builds a graph.
"""

from __future__ import annotations

from rasterflow.atomic import publish
from rasterflow.write.encoding import ENCODING_DTYPES, Encoding, compression_name, encode_block
from rasterflow.write.files import exists, filesystem, is_remote, path_size, remove, upload_verified
from rasterflow.write.naming import cog_entries, cog_output_paths, leading_dims, spatial_dims
from rasterflow.write.preflight import check_output_target
from rasterflow.write.result import WriteResult
from rasterflow.write.zarrstate import (
    COMPLETE_ATTR,
    FINGERPRINT_ATTR,
    STAGING_SUFFIX,
    ZarrState,
    is_complete_zarr,
    read_zarr_state,
    zarr_staging_path,
)

__all__ = [
    "WriteResult",
    "check_output_target",
    "is_complete_zarr",
    "cog_output_paths",
    "is_remote",
    "filesystem",
    "zarr_staging_path",
    "publish",
    "upload_verified",
    "read_zarr_state",
    "ZarrState",
    "path_size",
    "spatial_dims",
    "leading_dims",
    "Encoding",
    "encode_block",
    "ENCODING_DTYPES",
    # imported from here by other modules too (not in this list before the split)
    "COMPLETE_ATTR",
    "FINGERPRINT_ATTR",
    "STAGING_SUFFIX",
    "cog_entries",
    "compression_name",
    "exists",
    "remove",
]
