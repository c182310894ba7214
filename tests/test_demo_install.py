"""Issue 12: ``rasterflow demo`` works from a regular (non-editable) install, in any directory.

The package is built and installed with ``pip install --no-deps`` into a fresh venv (the dependencies come from the
test environment through a ``.pth`` path line, which adds its site-packages without running its ``.pth`` hooks, so
the editable rasterflow of the checkout stays invisible). The source is copied first, so the build leaves nothing
in the checkout. pip fetches the build backend (setuptools) from the package index or its cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import rasterio

from stac_schemas import validate_stac

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_then_demo_in_an_empty_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "rasterflow", src / "rasterflow", ignore=shutil.ignore_patterns("__pycache__"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "_rasterflow_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(src)], env=env,
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run([str(python), "-c", "import rasterflow; print(rasterflow.__file__)"], env=env,
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed copy, not the checkout
    assert (Path(where).parent / "data" / "demo.yaml").is_file()  # the demo spec is package data

    work = tmp_path / "empty"
    work.mkdir()
    demo = subprocess.run([str(venv / "bin" / "rasterflow"), "demo"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    folder = work / "rasterflow-demo"
    output = folder / "out" / "demo_ndvi_median.zarr"
    assert f"demo folder: {folder}" in demo.stdout and f"result: {output}" in demo.stdout
    assert sorted(p.name for p in work.iterdir()) == ["rasterflow-demo"]  # nothing outside the demo folder
    assert (folder / "demo.yaml").is_file() and (folder / "data" / "sample" / "items.json").is_file()
    with rasterio.open(f'ZARR:"{output}":/ndvi') as src_ds:  # what QGIS would open
        assert src_ds.crs.to_epsg() == 32633 and src_ds.transform.c == 380000 and src_ds.transform.f == 5830000
        values = src_ds.read(1)
        assert 0.2 < float(abs(values[values == values]).mean()) < 1
    item = json.loads(Path(str(output) + ".stac-item.json").read_text())
    validate_stac(item)
    assert item["assets"]["data"]["href"] == str(output)
    report = Path(str(output) + ".report.json")
    umask = os.umask(0o022)
    os.umask(umask)
    assert report.stat().st_mode & 0o777 == 0o666 & ~umask
    # --out puts the demo folder elsewhere
    again = subprocess.run([str(venv / "bin" / "rasterflow"), "demo", "--out", str(tmp_path / "elsewhere")],
                           cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "elsewhere" / "out" / "demo_ndvi_median.zarr").is_dir()


def test_bundled_demo_spec_is_the_pipelines_demo_with_paths_of_its_own():
    """The spec in the package and pipelines/demo.yaml describe the same job; only where they read and write differ."""
    import yaml

    bundled = yaml.safe_load((REPO / "rasterflow" / "data" / "demo.yaml").read_text())
    checkout = yaml.safe_load((REPO / "pipelines" / "demo.yaml").read_text())
    assert bundled["source"]["stac"].pop("catalog") == "data/sample/items.json"
    assert bundled["output"].pop("path") == "out/demo_ndvi_median.zarr"
    checkout["source"]["stac"].pop("catalog")
    checkout["output"].pop("path")
    assert bundled == checkout
