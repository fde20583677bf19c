"""Layer: pure CPU, packaging. The built wheel holds what an installed syncopate reads at run time
(the packaged sweep configs, the database migrations, py.typed) and, installed without a checkout,
runs the quickstart; a config is found by its path or, for a packaged one, by its bare name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from syncopate.autotuner.sweep import load_sweep, packaged_configs, resolve_config
from syncopate.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "syncopate"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the source tree (the build leaves build/ and egg-info behind)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(PACKAGE, src / "syncopate", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = src / "dist"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import setuptools.build_meta as b, sys; b.build_wheel(sys.argv[1])",
            str(dist),
        ],
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    )
    (path,) = dist.glob("syncopate-*.whl")
    return path


def test_the_wheel_holds_the_configs_the_migrations_and_py_typed(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"syncopate/py.typed", "syncopate/configs/quickstart.yaml"}
    migrations = PACKAGE / "results_db" / "migrations"
    wanted |= {
        f"syncopate/{p.relative_to(PACKAGE).as_posix()}"
        for p in migrations.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {
        "syncopate/results_db/migrations/alembic.ini",
        "syncopate/results_db/migrations/script.py.mako",
    } <= wanted
    assert any(n.startswith("syncopate/results_db/migrations/versions/") for n in wanted)
    assert wanted - names == set()
    modules = {
        f"syncopate/{p.relative_to(PACKAGE).as_posix()}"
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules - names == set()
    entry_points = zipfile.ZipFile(wheel).read("syncopate-0.1.0.dist-info/entry_points.txt").decode()
    assert "syncopate = syncopate.cli:main" in entry_points


def test_every_packaged_config_is_valid_and_the_checkout_links_the_quickstart():
    assert "quickstart" in packaged_configs()
    for name in packaged_configs():
        assert load_sweep(name).name == name
    assert (REPO / "configs" / "quickstart.yaml").samefile(PACKAGE / "configs" / "quickstart.yaml")


def test_a_bare_name_is_the_packaged_config_and_a_path_is_only_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = PACKAGE / "configs" / "quickstart.yaml"
    assert resolve_config("quickstart").samefile(packaged)
    assert resolve_config("quickstart.yaml").samefile(packaged)
    assert load_sweep("quickstart").name == "quickstart"
    # outside a checkout, the repository's path names nothing; the message names the packaged copy
    with pytest.raises(
        ConfigError,
        match=r"'configs/quickstart.yaml' does not exist; `quickstart` alone names the "
        r"copy shipped with syncopate",
    ):
        load_sweep("configs/quickstart.yaml")
    with pytest.raises(ConfigError, match=r"config file 'nosuch' does not exist$"):
        load_sweep("nosuch")
    # a file of that name in the current folder is the config the user means
    (tmp_path / "quickstart").write_text((packaged.read_text()).replace("name: quickstart", "name: mine"))
    assert load_sweep("quickstart").name == "mine"


@pytest.mark.slow
def test_the_installed_wheel_runs_the_quickstart_without_a_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    work = tmp_path / "work"  # no configs/, no syncopate/: only the installed package
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCOPATE_")}
    env.update(PYTHONPATH=str(target), XDG_DATA_HOME=str(tmp_path / "xdg"))
    code = (
        "import sys, syncopate; from syncopate.cli import main; print('from', syncopate.__file__); "
        "sys.exit(main(sys.argv[1:]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "tune", "quickstart", "--max-trials", "4"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"from {target / 'syncopate' / '__init__.py'}" in r.stdout
    assert "PREDICTED by the cost model" in r.stdout
    assert (tmp_path / "xdg" / "syncopate" / "results.db").is_file()
