"""The demo spec (package data, so it ships in every install) and the folder ``rasterflow demo`` works in."""

from __future__ import annotations

import os
from pathlib import Path

from rasterflow.sample.files import write_text

__all__ = ["DEMO_FOLDER", "demo_spec_text", "write_demo_spec"]

#: Where ``rasterflow demo`` works when no ``--out`` is given: a folder of the current directory.
DEMO_FOLDER = "rasterflow-demo"


def demo_spec_text() -> str:
    """The demo spec bundled with the package (``rasterflow/data/demo.yaml``); its paths are relative to itself."""
    from importlib.resources import files

    return files("rasterflow").joinpath("data", "demo.yaml").read_text(encoding="utf-8")


def write_demo_spec(folder: str | os.PathLike[str]) -> Path:
    """Copy the bundled demo spec to ``<folder>/demo.yaml`` (kept when it exists, so it can be edited and rerun).

    The spec reads ``data/sample/items.json`` and writes ``out/`` relative to itself, so a demo run touches nothing
    outside ``folder``.
    """
    folder = Path(folder).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "demo.yaml"
    if not spec.exists():
        write_text(spec, demo_spec_text())
    return spec
