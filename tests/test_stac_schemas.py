"""The offline STAC validation of tests/stac_schemas.py: the official schemas (vendored verbatim in tests/schemas) for
every schema rasterflow's documents declare, and what they reject that a hand-written copy let through.

The STAC documents of real runs are validated in test_outputs.py (with a misspelt ``proj:`` key among the breakages
of a written item), test_tiling.py and test_demo_install.py.
"""

from __future__ import annotations

import copy
import json

import pytest
from pystac.errors import STACValidationError
from referencing.exceptions import Unresolvable, Unretrievable
from stac_schemas import REGISTRY, SCHEMA_DIR, SCHEMAS, validate_stac

from rasterflow import sample
from rasterflow.write import stac

PROJ = stac.STAC_EXTENSIONS["proj"]
# The one official schema whose "$id" is not its URL: v1.1.0 common.json says ".../commonjson" (item.json and
# collection.json refer to it as "common.json", which is why the registry is keyed by URL).
ID_TYPOS = {"https://schemas.stacspec.org/v1.1.0/item-spec/json-schema/common.json":
            "https://schemas.stacspec.org/v1.1.0/item-spec/json-schema/commonjson"}


def _core(version: str, kind: str) -> str:
    return f"https://schemas.stacspec.org/v{version}/{kind}-spec/json-schema/{kind}.json"


def test_every_schema_rasterflow_declares_is_vendored():
    declared = {
        _core(stac.STAC_VERSION, "item"), _core(stac.STAC_VERSION, "collection"), *stac.STAC_EXTENSIONS.values(),
        _core(sample.STAC_VERSION, "item"), _core(sample.STAC_VERSION, "collection"), *sample.STAC_EXTENSIONS,
    }
    assert declared <= set(SCHEMAS), declared - set(SCHEMAS)


def test_vendored_schemas_are_the_official_files_with_their_licences():
    for url, schema in SCHEMAS.items():
        assert schema["$schema"] == "http://json-schema.org/draft-07/schema#", url
        assert schema["$id"].rstrip("#") == ID_TYPOS.get(url, url)
    readme = (SCHEMA_DIR / "README.md").read_text()
    for folder in (p for p in SCHEMA_DIR.iterdir() if p.is_dir()):
        assert (folder / "LICENSE").is_file() or (folder / "license.md").is_file(), folder
        for version in (p.name for p in folder.iterdir() if p.is_dir()):
            assert f"{folder.name} {version}" in readme, (folder.name, version)


def _item(**properties) -> dict:
    """A minimal Item shaped like rasterflow's (tests/test_outputs.py validates the written ones)."""
    return {
        "type": "Feature",
        "stac_version": stac.STAC_VERSION,
        "stac_extensions": [PROJ],
        "id": "median.tif",
        "geometry": {"type": "Polygon", "coordinates": [[[13, 52], [14, 52], [14, 53], [13, 53], [13, 52]]]},
        "bbox": [13, 52, 14, 53],
        "properties": {"datetime": "2024-06-01T00:00:00Z", "proj:code": "EPSG:32633", "proj:shape": [256, 256],
                       "proj:transform": [10.0, 0.0, 380000.0, 0.0, -10.0, 5830000.0], **properties},
        "links": [],
        "assets": {"data": {"href": "/out/median.tif", "roles": ["data"]}},
    }


def test_a_misspelt_proj_key_fails_against_the_projection_schema():
    assert validate_stac(_item()) == [_core(stac.STAC_VERSION, "item"), PROJ]
    for misspelt in (_item(**{"proj:epgs": 32633}), _item(**{"proj:epsg": 32633})):  # proj:epsg: gone in v2.0
        with pytest.raises(STACValidationError, match=f"invalid against {PROJ}.*'proj:eps?gs?'"):
            validate_stac(misspelt)
    on_asset = _item()
    on_asset["assets"]["data"]["proj:shapes"] = [256, 256]
    with pytest.raises(STACValidationError, match="proj:shapes"):
        validate_stac(on_asset)


def test_a_schema_that_is_not_vendored_is_an_error_not_a_download():
    item = _item()
    item["stac_extensions"].append("https://stac-extensions.github.io/eo/v2.0.0/schema.json")
    with pytest.raises(AssertionError, match="no offline schema for https://stac-extensions.github.io/eo/v2.0.0"):
        validate_stac(item)
    old = copy.deepcopy(item)
    old["stac_version"] = "0.9.0"
    old["stac_extensions"] = []
    with pytest.raises(AssertionError, match="no offline schema for https://schemas.stacspec.org/v0.9.0/"):
        validate_stac(old)
    with pytest.raises(Unresolvable) as refused:  # a $ref to an URL not vendored: refused, not downloaded
        REGISTRY.resolver().lookup("https://stac-extensions.github.io/eo/v2.0.0/schema.json")
    assert isinstance(refused.value.__cause__, Unretrievable)
    assert "not vendored under tests/schemas" in str(refused.value.__cause__.__cause__)


def test_the_sample_generator_writes_valid_stac(tmp_path):
    catalog = sample.generate_sample(tmp_path, size=32, n_dates=2, blocksize=16)
    for item in catalog.items():
        assert validate_stac(item)[1:] == sample.STAC_EXTENSIONS
    collection = json.loads(catalog.collection_json.read_text())
    assert validate_stac(collection)[0] == _core(sample.STAC_VERSION, "collection")
