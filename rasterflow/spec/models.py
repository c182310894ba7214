"""Pydantic models of the pipeline spec, version 1 (``shared/design/SPEC.md``), under their first import path.

Each section's models live in a module of their own (``common``, ``source``, ``grid``, ``reduce``, ``output``,
``cluster``, ``mask``, ``pipeline``: the top-level :class:`Spec`); this module re-exports them.

The models only describe; they validate shape, ranges and cross-field rules, and never touch the network or pixels.
Every field carries a description so the generated JSON Schema documents itself in editors.
"""

from __future__ import annotations

from rasterflow.spec.common import (
    check_identifier as check_identifier,
    function_names as function_names,
    IDENTIFIER as IDENTIFIER,
    LocatedError as LocatedError,
    SpecModel as SpecModel,
    PositiveFloat as PositiveFloat,
    RESAMPLING_METHODS as RESAMPLING_METHODS,
    Size as Size,
)
from rasterflow.spec.source import (
    AssetOverride as AssetOverride,
    Source as Source,
    SOURCE_DTYPES as SOURCE_DTYPES,
    SourceIO as SourceIO,
    SourceRetry as SourceRetry,
    StacSource as StacSource,
)
from rasterflow.spec.grid import (
    Chunks as Chunks,
    ChunkSize as ChunkSize,
    EPSG_PATTERN as EPSG_PATTERN,
    Grid as Grid,
)
from rasterflow.spec.reduce import (
    check_composite as check_composite,
    check_statistics as check_statistics,
    COMPOSITE_METHODS as COMPOSITE_METHODS,
    CUBE_DIMS as CUBE_DIMS,
    Reduce as Reduce,
    REDUCE_METHODS as REDUCE_METHODS,
    ReduceMethod as ReduceMethod,
    statistic_name as statistic_name,
)
from rasterflow.spec.output import (
    COG_RESAMPLINGS as COG_RESAMPLINGS,
    CogOptions as CogOptions,
    COMPRESSION_CODECS as COMPRESSION_CODECS,
    FORMAT_BY_SUFFIX as FORMAT_BY_SUFFIX,
    Output as Output,
    OUTPUT_DTYPES as OUTPUT_DTYPES,
    OutputEncoding as OutputEncoding,
    Tiling as Tiling,
)
from rasterflow.spec.cluster import (
    Budget as Budget,
    Cluster as Cluster,
    MemoryThresholds as MemoryThresholds,
)
from rasterflow.spec.mask import (
    cleanup_halo as cleanup_halo,
    MaskStep as MaskStep,
)
from rasterflow.spec.pipeline import (
    divisor_near as divisor_near,
    Spec as Spec,
)

__all__ = [
    "Spec",
    "Source",
    "SourceRetry",
    "StacSource",
    "AssetOverride",
    "Grid",
    "Chunks",
    "Reduce",
    "Output",
    "OutputEncoding",
    "CogOptions",
    "Tiling",
    "Cluster",
    "MemoryThresholds",
    "Budget",
    "REDUCE_METHODS",
    "ReduceMethod",
    "CUBE_DIMS",
]
