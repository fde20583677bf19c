"""Layer: pure CPU logic of the results database: URL resolution, JSON with non-finite floats, schema
revisions against the shipped migration scripts, and what a wheel carries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncopate.errors import ConfigError, SchemaError
from syncopate.results_db import codec
from syncopate.results_db.migrate import MIGRATIONS_DIR, alembic_config
from syncopate.results_db.schema import HEAD, REVISIONS, check_revision
from syncopate.results_db.urls import default_path, locate, redact

ROOT = Path(__file__).resolve().parent.parent


def test_default_path_honours_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "syncopate" / "results.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_path() == Path.home() / ".local" / "share" / "syncopate" / "results.db"


def test_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    default = locate(None)
    assert default.is_default and default.sqlite_path == tmp_path / "syncopate" / "results.db"
    assert default.url == f"sqlite:///{tmp_path}/syncopate/results.db"
    monkeypatch.setenv("SYNCOPATE_DB", "postgresql://tuner@db/syncopate")
    env = locate(None)
    assert (env.url, env.is_default, env.dialect) == (
        "postgresql+psycopg://tuner@db/syncopate",
        False,
        "postgresql",
    )
    explicit = locate("results/h200.db")
    assert explicit.sqlite_path == Path.cwd() / "results" / "h200.db" and not explicit.is_default
    assert locate("sqlite:///rel/x.db").sqlite_path == Path("rel/x.db")
    assert locate("sqlite:////abs/x.db").sqlite_path == Path("/abs/x.db")
    assert locate("postgres://u@h/d").url == "postgresql+psycopg://u@h/d"


def test_unsupported_urls_and_passwords_in_messages():
    with pytest.raises(ConfigError, match=r"'mysql://u:\*\*\*@h/d' is not supported"):
        locate("mysql://u:pw@h/d")
    assert redact("postgresql+psycopg://tuner:s3cr@t@db:5432/x") == "postgresql+psycopg://tuner:***@db:5432/x"
    assert redact("sqlite:////a/b.db") == "sqlite:////a/b.db"


floats = st.floats(allow_nan=True, allow_infinity=True)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


@given(documents)
def test_json_round_trips_non_finite_floats(doc):
    text = codec.dumps(doc)
    # strict JSON: no NaN or Infinity constant (a key or a string may still spell "NaN")
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written as a JSON constant"))
    assert _same(doc, codec.loads(text))


def test_json_refuses_what_it_cannot_store_and_names_where():
    with pytest.raises(ConfigError, match=r"worker\.gpus\[1\]=.* of type object"):
        codec.encode({"gpus": ["a", object()]}, "worker")
    with pytest.raises(ConfigError, match="JSON keys must be strings"):
        codec.encode({1: 2}, "config")


def test_revisions_match_the_shipped_migration_scripts():
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    shipped = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert tuple(shipped) == REVISIONS
    assert script.get_current_head() == HEAD


def test_check_revision_messages():
    check_revision(HEAD, "x.db")
    with pytest.raises(
        SchemaError, match=r"x\.db has no Syncopate tables: run `syncopate db upgrade --db x\.db`"
    ):
        check_revision(None, "x.db")
    with pytest.raises(SchemaError, match="newer than this version of Syncopate knows"):
        check_revision("ffff", "x.db")


def test_a_wheel_carries_the_migrations():
    """Migrations are packages (so their .py files are packaged) plus package data for the rest."""
    from setuptools import find_packages

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {"syncopate.results_db.migrations", "syncopate.results_db.migrations.versions"} <= set(packages)
    data = config["tool"]["setuptools"]["package-data"]["syncopate"]
    shipped = {p.relative_to(ROOT / "syncopate").as_posix() for p in MIGRATIONS_DIR.iterdir() if p.is_file()}
    non_python = {p for p in shipped if not p.endswith(".py")}
    assert non_python == {"results_db/migrations/script.py.mako", "results_db/migrations/alembic.ini"}
    from fnmatch import fnmatch

    assert all(any(fnmatch(p, pattern) for pattern in data) for p in non_python)
