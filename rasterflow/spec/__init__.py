"""The pipeline spec: pydantic models, YAML loading with file:line:col errors, and the JSON Schema."""

from rasterflow.spec.loader import LoadedSpec, load_spec, load_spec_text
from rasterflow.spec.models import (
    Budget,
    Chunks,
    Cluster,
    Grid,
    MemoryThresholds,
    Output,
    Reduce,
    Source,
    Spec,
    StacSource,
)
from rasterflow.spec.schema import SCHEMA_PATH, spec_json_schema

__all__ = [
    "Budget",
    "Chunks",
    "Cluster",
    "Grid",
    "LoadedSpec",
    "MemoryThresholds",
    "Output",
    "Reduce",
    "SCHEMA_PATH",
    "Source",
    "Spec",
    "StacSource",
    "load_spec",
    "load_spec_text",
    "spec_json_schema",
]
