"""Offline STAC validation: pystac's JSON-Schema validator with every schema resolved locally.

pystac (a project dependency) bundles the STAC 1.1.0 core schemas (Item, Collection, Catalog and the GeoJSON ones)
and resolves them without a network. The extension schemas (projection v2.0.0, raster v1.1.0, processing v1.2.0,
file v2.1.0) are published only on stac-extensions.github.io, which these machines and CI cannot reach, and no PyPI
package ships them (stac-validator and stac-check download them at run time). So the extension schemas below are
written here from the extensions' field tables: the fields rasterflow writes, their types and ranges, and the
rule that a document using an extension lists it in ``stac_extensions``. They are registered under the official
URIs, so pystac resolves every ``$ref`` locally and any schema it cannot find is an error (never a silent pass).
With a network, ``validate_stac(doc, online=True)`` validates against the published schemas instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXTENSION_SCHEMAS", "validate_stac"]

_NUMBER = {"type": "number"}


def _extension(uri: str, prefix: str, fields: dict[str, Any], *, on: tuple[str, ...]) -> dict[str, Any]:
    """A schema for an extension's fields on ``on`` (properties, assets), requiring the extension be declared."""
    field_schema = {"type": "object", "properties": fields}
    item_checks: list[dict] = []
    collection_checks: list[dict] = []
    if "properties" in on:
        item_checks.append({"properties": {"properties": field_schema}})
    if "assets" in on:
        assets = {"type": "object", "additionalProperties": field_schema}
        item_checks.append({"properties": {"assets": assets}})
        collection_checks.append({"properties": {"assets": assets, "item_assets": assets}})
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": uri,
        "type": "object",
        "required": ["stac_extensions"],
        "properties": {"stac_extensions": {"type": "array", "contains": {"const": uri}}},
        "oneOf": [
            {"required": ["type", "properties", "assets"], "properties": {"type": {"const": "Feature"}},
             "allOf": item_checks or [{}]},
            {"required": ["type"], "properties": {"type": {"const": "Collection"}},
             "allOf": collection_checks or [{}]},
        ],
    }


_PROJ = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
_RASTER = "https://stac-extensions.github.io/raster/v1.1.0/schema.json"
_PROCESSING = "https://stac-extensions.github.io/processing/v1.2.0/schema.json"
_FILE = "https://stac-extensions.github.io/file/v2.1.0/schema.json"

_proj_fields = {
    "proj:code": {"type": ["string", "null"], "pattern": "^[A-Z]+:[A-Za-z0-9.]+$"},
    "proj:wkt2": {"type": ["string", "null"]},
    "proj:projjson": {"type": ["object", "null"]},
    "proj:bbox": {"type": "array", "items": _NUMBER, "oneOf": [{"minItems": 4, "maxItems": 4},
                                                               {"minItems": 6, "maxItems": 6}]},
    "proj:shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
    "proj:transform": {"type": "array", "items": _NUMBER, "oneOf": [{"minItems": 6, "maxItems": 6},
                                                                    {"minItems": 9, "maxItems": 9}]},
}
_DATA_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
               "float64", "cint16", "cint32", "cfloat32", "cfloat64", "other"]
_raster_band = {
    "type": "object",
    "properties": {
        "nodata": {"oneOf": [_NUMBER, {"enum": ["nan", "inf", "-inf"]}]},
        "sampling": {"enum": ["area", "point"]},
        "data_type": {"enum": _DATA_TYPES},
        "bits_per_sample": {"type": "integer", "minimum": 1},
        "spatial_resolution": _NUMBER,
        "statistics": {"type": "object", "properties": {
            "minimum": _NUMBER, "maximum": _NUMBER, "mean": _NUMBER, "stddev": {"type": "number", "minimum": 0},
            "valid_percent": {"type": "number", "minimum": 0, "maximum": 100}}},
        "unit": {"type": "string"},
        "scale": _NUMBER,
        "offset": _NUMBER,
        "histogram": {"type": "object"},
    },
}
_raster_fields = {"raster:bands": {"type": "array", "minItems": 1, "items": _raster_band}}
_processing_fields = {
    "processing:level": {"type": "string"},
    "processing:facility": {"type": "string"},
    "processing:lineage": {"type": "string"},
    "processing:version": {"type": "string"},
    "processing:datetime": {"type": "string", "format": "date-time",
                            "pattern": "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?(Z|[+-]\\d{2}:\\d{2})$"},
    "processing:software": {"type": "object", "additionalProperties": {"type": "string"}},
    "processing:expression": {"type": "object", "required": ["format", "expression"],
                              "properties": {"format": {"type": "string"}, "expression": {}}},
}
_file_fields = {
    "file:size": {"type": "integer", "minimum": 0},
    "file:checksum": {"type": "string", "pattern": "^[a-f0-9]+$"},
    "file:header_size": {"type": "integer", "minimum": 0},
    "file:byte_order": {"enum": ["big-endian", "little-endian"]},
    "file:local_path": {"type": "string"},
}

EXTENSION_SCHEMAS: dict[str, dict[str, Any]] = {
    _PROJ: _extension(_PROJ, "proj", _proj_fields, on=("properties", "assets")),
    _RASTER: _extension(_RASTER, "raster", _raster_fields, on=("assets",)),
    _PROCESSING: _extension(_PROCESSING, "processing", _processing_fields, on=("properties",)),
    _FILE: _extension(_FILE, "file", _file_fields, on=("assets",)),
}


def validate_stac(document: dict[str, Any], *, online: bool = False) -> list[str]:
    """Validate a STAC Item or Collection (core + every extension it declares) with pystac; returns the schema
    URIs used. Raises ``pystac.errors.STACValidationError`` when invalid (and, offline, when a schema is unknown)."""
    import pystac.validation
    from pystac.validation.stac_validator import JsonSchemaSTACValidator

    validator = JsonSchemaSTACValidator()
    if not online:
        validator.schema_cache.update(EXTENSION_SCHEMAS)
        for uri in document.get("stac_extensions") or []:
            if uri not in validator.schema_cache:
                raise AssertionError(f"no offline schema for {uri}; add it to tests/stac_schemas.py")
    return pystac.validation.validate_dict(document, validator=validator)
