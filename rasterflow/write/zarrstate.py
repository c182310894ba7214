"""The state of a rasterflow Zarr store as its group attributes record it (which job's fingerprint, complete or
not), and where a Zarr write is staged before it is put in place.

Standard library at import time; zarr loads inside :func:`read_zarr_state`, and only when something is at the path.
"""

from __future__ import annotations

import dataclasses
import warnings

from rasterflow.write.files import exists

__all__ = ["FINGERPRINT_ATTR", "COMPLETE_ATTR", "STAGING_SUFFIX", "ZarrState", "read_zarr_state", "is_complete_zarr",
           "zarr_staging_path"]

#: Group attributes a rasterflow Zarr store carries.
FINGERPRINT_ATTR = "rasterflow_fingerprint"
COMPLETE_ATTR = "rasterflow_complete"

#: The staging store of a local Zarr write is ``<path><STAGING_SUFFIX>``, a sibling of the output.
STAGING_SUFFIX = ".partial"


@dataclasses.dataclass(frozen=True)
class ZarrState:
    """The rasterflow attributes of an existing Zarr store."""

    fingerprint: str | None
    complete: bool


def read_zarr_state(path: str) -> ZarrState | None:
    """The rasterflow state of the Zarr store at ``path``.

    Reads the group attributes directly (not the consolidated metadata, which is written only at the end).

    Parameters
    ----------
    path : str
        A local path or a URL.

    Returns
    -------
    ZarrState or None
        None when nothing there opens as a Zarr group.
    """
    if not exists(path):
        return None
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            group = zarr.open_group(str(path), mode="r", use_consolidated=False)
            attrs = dict(group.attrs)
    except Exception:  # not a Zarr group: someone else's file or directory
        return None
    fingerprint = attrs.get(FINGERPRINT_ATTR)
    return ZarrState(fingerprint=None if fingerprint is None else str(fingerprint),
                     complete=attrs.get(COMPLETE_ATTR) is True)


def is_complete_zarr(path: str) -> bool:
    """Whether ``path`` is a Zarr store that rasterflow finished writing (``rasterflow_complete: true``).

    Parameters
    ----------
    path : str
        A local path or a URL.

    Returns
    -------
    bool
    """
    state = read_zarr_state(path)
    return bool(state and state.complete)


def zarr_staging_path(path: str) -> str:
    """Where a Zarr write is staged before it is put in place (renamed locally, copied object by object on an object
    store, see :mod:`rasterflow.write.zarr`).

    Parameters
    ----------
    path : str
        The output store.

    Returns
    -------
    str
        ``<path>.partial`` (a trailing ``/`` dropped).
    """
    return str(path).rstrip("/") + STAGING_SUFFIX
