"""The JSON Schema of the spec, generated from the models (``rasterflow schema --write``)."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from rasterflow.spec.models import Spec

__all__ = ["SCHEMA_PATH", "spec_json_schema", "schema_text"]

SCHEMA_PATH = PurePosixPath("schemas/rasterflow.schema.json")
"""Where the committed schema lives, relative to the repository root."""


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a version-1 spec, as editors consume it."""
    schema = Spec.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://rasterflow.dev/schemas/rasterflow.schema.json",
        "title": "rasterflow pipeline spec, version 1",
        **schema,
    }


def schema_text() -> str:
    """The schema as it is written to disk: sorted keys, two-space indent, trailing newline."""
    return json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
