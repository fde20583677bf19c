"""Shared fixtures and the skip rules for tests that need hardware or services."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# One compute thread per process, in the test processes and in every process a test starts (which
# inherit it): the suite runs two workers on CI's two cores and the ranks of a test side by side, so
# more threads only oversubscribe the cores, where OpenMP's idle threads spin for a core that is
# busy. Set before torch or numpy is imported here; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


# The kernels are Triton JIT functions made when their module is first imported, compiled or
# interpreted after TRITON_INTERPRET at that moment. Without a GPU only the interpreter can run
# them: set it before any test module imports them, so that no order of test files compiles them
# for a GPU that is not there (tests/test_kernels_interpreter.py sets it too, for GPU machines).
if _cuda_count() == 0:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Hypothesis's time limit per example (200 ms) is not what the property tests check, and a machine
# busy with the other worker's tests can pass it: no limit.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure(config):
    """Under `--dist loadgroup`, pytest-xdist up to 3.8 sends the tests of a group to one worker by
    appending `@group` to their ids, which pytest 9.2 no longer lets it change (pytest-xdist issue
    1386): the groups would be dropped without a word and grouped tests run at once. Refuse that
    pair, saying what to do."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    import importlib.metadata as md

    from packaging.version import Version

    xdist = md.version("pytest-xdist")
    if Version(pytest.__version__) >= Version("9.2.0.dev0") and Version(xdist) < Version("3.9.0.dev0"):
        raise pytest.UsageError(
            f"pytest-xdist {xdist} cannot keep the xdist_group tests together on pytest "
            f"{pytest.__version__}: install the dev extra's pytest (pip install -e '.[dev]', pytest<9.2), "
            f"or run in one process with -n 0"
        )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    """Skip what needs GPUs that are not here; put the GPU tests in one xdist group: two at once
    would share the devices."""
    gpus = _cuda_count()
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("gpu"))
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is present"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs two CUDA GPUs on one host; {gpus} present"))


# ---- databases ---------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def no_database_in_the_real_home(tmp_path_factory):
    """The per-user default database of every test, and of every process a test starts, is under a
    temporary XDG_DATA_HOME; SYNCOPATE_DB is unset. Tests that use the default set their own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data-home")))
        mp.delenv("SYNCOPATE_DB", raising=False)
        yield


PG_DEFAULT_URL = "postgresql+psycopg:///syncopate_test"
"""The server and maintenance database the PostgreSQL tests use unless SYNCOPATE_TEST_PG says
otherwise (a Unix-socket URL; see .ci/run for how the cluster is started)."""


@pytest.fixture(scope="session")
def pg_database_url():
    """A fresh PostgreSQL database for this test session, dropped at its end.

    Skips with the reason where no server answers; in CI (CI=true) fails instead.
    """
    import uuid

    import sqlalchemy as sa

    base = os.environ.get("SYNCOPATE_TEST_PG", PG_DEFAULT_URL)
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except Exception as e:  # any failure to reach the server means the same: no server here
        engine.dispose()
        reason = str(getattr(e, "orig", e)).strip().splitlines()[0]
        message = (
            f"no PostgreSQL server answers at {base} ({reason}); start one as .ci/run does, "
            f"or point SYNCOPATE_TEST_PG at one"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    name = f"syncopate_t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with engine.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield engine.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture
def pg_url(pg_database_url):
    """A fresh, empty schema in the session's PostgreSQL database: a URL whose search_path is it."""
    import uuid

    import sqlalchemy as sa

    schema = f"t_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(pg_database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.engine.make_url(pg_database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """An empty database of each kind: a SQLite file, then a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("pg_url")
