"""Offline STAC validation against the official JSON schemas, vendored verbatim under ``tests/schemas``.

The published schemas (schemas.stacspec.org, geojson.org/schema, stac-extensions.github.io) cannot be downloaded on
these machines nor in CI, and no PyPI package ships the extension schemas. So the official files are copied verbatim
into ``tests/schemas`` (sources, licences and how to update them: ``tests/schemas/README.md``), each registered under
the URL it is published at, in a ``referencing.Registry`` whose retrieval refuses everything else: every ``$ref``
between them resolves locally, and a schema that is not vendored is an error, never a download or a silent pass.

``validate_stac(doc)`` validates a STAC Item, Collection or Catalog against the core schema of its ``stac_version``
and against the schema of every extension it lists in ``stac_extensions``, as pystac and stac-validator do (JSON
Schema draft 7; ``format`` is an annotation there and is not asserted, as in pystac). With a network,
``validate_stac(doc, online=True)`` uses pystac's validator and the published schemas instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from pystac.errors import STACValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

__all__ = ["EXTENSION_SCHEMAS", "REGISTRY", "SCHEMAS", "SCHEMA_DIR", "schema_url", "validate_stac"]

SCHEMA_DIR = Path(__file__).with_name("schemas")

_CORE = "https://schemas.stacspec.org/"
_GEOJSON = "https://geojson.org/schema/"
_EXTENSIONS = "https://stac-extensions.github.io/"
_KINDS = {"Feature": "item", "Collection": "collection", "Catalog": "catalog"}


def schema_url(path: Path) -> str:
    """The URL a vendored schema file is published at (its folder layout mirrors the URL's path):
    ``stac-spec/<v>/<path>`` -> schemas.stacspec.org, ``geojson/<name>`` -> geojson.org/schema,
    ``<extension>/<v>/schema.json`` -> stac-extensions.github.io."""
    top, *rest = path.relative_to(SCHEMA_DIR).parts
    if top == "stac-spec":
        return _CORE + "/".join(rest)
    if top == "geojson":
        return _GEOJSON + "/".join(rest)
    return _EXTENSIONS + "/".join([top, *rest])


def _load() -> dict[str, dict[str, Any]]:
    # Keyed by the published URL rather than by "$id": the official v1.1.0 common.json says
    # ".../item-spec/json-schema/commonjson" (an upstream typo) while item.json refers to "common.json".
    return {schema_url(path): json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(SCHEMA_DIR.rglob("*.json"))}


SCHEMAS: dict[str, dict[str, Any]] = _load()
"""Every vendored schema (core, GeoJSON, extensions) by the URL it is published at."""
EXTENSION_SCHEMAS: dict[str, dict[str, Any]] = {url: s for url, s in SCHEMAS.items() if url.startswith(_EXTENSIONS)}
"""The extension schemas, by the URL documents list in ``stac_extensions``."""


def _offline(uri: str) -> Resource:
    raise LookupError(f"{uri}: not vendored under tests/schemas, and validation is offline (see its README.md)")


# jsonschema adds the draft metaschemas (collection.json refers to http://json-schema.org/draft-07/schema).
REGISTRY: Registry = Registry(retrieve=_offline).with_resources(  # type: ignore[call-arg]
    (url, Resource.from_contents(schema, default_specification=DRAFT7)) for url, schema in SCHEMAS.items())


def _core_url(document: dict[str, Any]) -> str:
    kind = _KINDS.get(document.get("type"))  # type: ignore[arg-type]
    version = document.get("stac_version")
    if kind is None or not isinstance(version, str):
        raise STACValidationError(f"not a STAC Item, Collection or Catalog: type {document.get('type')!r}, "
                                  f"stac_version {version!r}")
    return f"{_CORE}v{version}/{kind}-spec/json-schema/{kind}.json"


def validate_stac(document: dict[str, Any], *, online: bool = False) -> list[str]:
    """Validate a STAC Item, Collection or Catalog (core + every extension it declares); returns the schema URLs
    used (the core one first, then ``stac_extensions`` as listed). Raises ``pystac.errors.STACValidationError``
    (its ``source`` the list of ``jsonschema`` errors) when invalid, and ``AssertionError`` when, offline, a schema
    is not vendored."""
    if online:
        import pystac.validation

        return pystac.validation.validate_dict(document)
    extensions = document.get("stac_extensions") or []
    urls = [_core_url(document), *extensions]
    missing = [url for url in urls if url not in SCHEMAS]
    if missing:
        raise AssertionError(f"no offline schema for {', '.join(missing)}; vendor it under tests/schemas "
                             "(tests/schemas/README.md)")
    for url in urls:
        errors = list(Draft7Validator(SCHEMAS[url], registry=REGISTRY).iter_errors(document))
        if errors:
            raise STACValidationError(f"{document.get('type')} {document.get('id')!r} is invalid against {url}: "
                                      f"{_describe(errors)}", source=errors)
    return urls


def _describe(errors: list) -> str:
    """The deepest error, looking inside oneOf/anyOf (the extension schemas wrap everything in one, Item or
    Collection; the branch that does not apply fails at ``$.type``), so the message names the wrong field rather
    than the whole document."""

    def leaves(found):
        for error in found:
            yield from leaves(error.context) if error.context else (error,)

    error = max(leaves(errors), key=lambda e: len(e.absolute_path))  # max: the first of the deepest
    return f"{error.json_path}: {error.message[:500]}"
