"""The files of a run's STAC documents: their names beside the output, absolute hrefs, writing a document
atomically (a local path or an fsspec URL), reading one back, and the ``file:checksum`` of an output file.

Standard library at import time; fsspec loads inside the functions, for URLs only.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import IO, Any

from rasterflow.atomic import write_text_atomic
from rasterflow.write.files import is_remote

__all__ = ["stac_paths", "item_path", "absolute_href", "write_text", "read_json", "file_checksum"]


def stac_paths(output_path: str) -> tuple[str, str]:
    """Where the Collection and the items file of an output go.

    Parameters
    ----------
    output_path : str
        The output as the spec names it (per-period files keep that name).

    Returns
    -------
    (str, str)
        ``<output>.stac-collection.json``, ``<output>.stac-items.json`` (``out/ndvi.tif`` ->
        ``out/ndvi.tif.stac-items.json``).
    """
    base = str(output_path).rstrip("/")
    return base + ".stac-collection.json", base + ".stac-items.json"


def item_path(file_path: str) -> str:
    """Where the Item of one output file goes.

    Parameters
    ----------
    file_path : str
        An output file (or Zarr store).

    Returns
    -------
    str
        ``out/ndvi_2024-06.tif`` -> ``out/ndvi_2024-06.tif.stac-item.json``.
    """
    return str(file_path).rstrip("/") + ".stac-item.json"


def absolute_href(path: str) -> str:
    """An href that works from wherever a document is read: a URL as it is, a local path made absolute.

    Parameters
    ----------
    path : str

    Returns
    -------
    str
    """
    return str(path) if is_remote(path) else os.path.abspath(str(path))


def write_text(path: str, text: str) -> None:
    """Write a document at once: a local file atomically (:func:`rasterflow.atomic.write_text_atomic`: a temporary
    file beside ``path``, mode 0666 minus the umask like any new file, synced, then renamed), an object with one PUT.

    Parameters
    ----------
    path : str
        A local path (parent directories are made) or an fsspec URL.
    text : str
        The whole document (UTF-8).
    """
    if is_remote(path):
        import fsspec.core

        fs, target = fsspec.core.url_to_fs(path)
        fs.pipe_file(target, text.encode())
        return
    write_text_atomic(path, text)


def _open_binary(path: str) -> IO[bytes]:
    if is_remote(path):
        import fsspec

        handle: IO[bytes] = fsspec.open(path, "rb").open()  # fsspec ships no annotations
        return handle
    return open(path, "rb")


def file_checksum(path: str) -> str:
    """The ``file:checksum`` of a file.

    Parameters
    ----------
    path : str
        A local path or an fsspec URL (downloaded to hash it).

    Returns
    -------
    str
        The SHA2-256 multihash: ``1220`` + the hex digest.
    """
    digest = hashlib.sha256()
    with _open_binary(path) as handle:
        for chunk in iter(lambda: handle.read(4 * 2**20), b""):
            digest.update(chunk)
    return "1220" + digest.hexdigest()


def read_json(path: str) -> dict[str, Any]:
    """Read back a STAC document (an Item written earlier).

    Parameters
    ----------
    path : str
        A local path or an fsspec URL.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        The file is not a JSON object.
    """
    with _open_binary(path) as handle:
        data = json.loads(handle.read().decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a STAC Item (a JSON object)")
    return data
