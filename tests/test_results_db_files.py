"""Layer: the results database's SQLite files on the CPU, as jobs and first runs meet them. A file
on a read-only mount is read (lookup, best, export, the repository) and nothing is created or
changed beside it, in a writable folder either; a writer is refused a file it cannot write before
it changes anything; a new database is made whole or not at all; another application's file is
left exactly as it was; a damaged file's error says what works.

Read-only files are read-only for real: as root (CI), the reads run in a child process that has
dropped to `nobody` (tests/support/unprivileged.py)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from db_data import trial, workload
from support.sweeps import fixture_sweep
from support.unprivileged import captured, listing, read_only, shared_folder, unprivileged

import syncopate
from syncopate.autotuner.store import open_store
from syncopate.cli import main
from syncopate.errors import DatabaseError, SchemaError, Terminated
from syncopate.records import Environment
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache
from syncopate.results_db.readers import open_source

SHAPE = ["--m", "8192", "--n", "4096", "--k", "8192", "--topology", "H200x2-nvlink"]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clear_cache()
    yield
    clear_cache()


def make_results(path: Path) -> Path:
    """A results file as a sweep leaves it (WAL mode, closed): one shape measured under this
    process's environment, the fastest trial 1500 µs."""
    env = Environment.current()
    with ResultsDB.open(path, upgrade=True) as db:
        sweep = db.start_sweep("s")
        db.record_trials(sweep, [trial(0, env=env, median_us=1600.0), trial(1, env=env, median_us=1500.0)])
    return path


@pytest.fixture
def folders():
    """(a writable results file, a copy of it in a folder of its own, a folder anyone may write
    in) in a folder `nobody` may enter."""
    with shared_folder() as root:
        original = make_results(root / "results.db")
        (root / "ro").mkdir()
        (root / "out").mkdir()
        (root / "out").chmod(0o777)
        shutil.copy(original, root / "ro" / "results.db")
        yield original, root / "ro" / "results.db", root / "out"


def _every_read(db: Path, out: Path) -> dict:
    """What a job and a person read from `db`: the lookup command and call, best, export, the
    repository read-only."""
    clear_cache()
    found = {}
    found["lookup"] = captured(lambda: main(["lookup", *SHAPE, "--db", str(db), "--json"]))
    clear_cache()
    result = syncopate.lookup((8192, 4096, 8192), "H200x2-nvlink", db=db)
    found["call"] = (result.match, result.time_us)
    found["best"] = captured(lambda: main(["best", "--db", str(db), "--json"]))
    found["export"] = captured(lambda: main(["export", "--db", str(db), "--out", str(out)]))
    with ResultsDB.open(db, read_only=True) as rdb:
        found["trials"] = len(rdb.trials())
    clear_cache()
    return found


def _check_reads(found: dict) -> None:
    code, out, err = found["lookup"]
    assert code == 0 and err == "", err
    assert json.loads(out)["match"] == "exact" and json.loads(out)["time_us"] == 1500.0
    assert found["call"] == ("exact", 1500.0)
    code, out, err = found["best"]
    assert code == 0 and err == "" and [row["median_us"] for row in json.loads(out)] == [1500.0], err
    code, _, err = found["export"]
    assert code == 0 and err == "", err
    assert found["trials"] == 2


def test_every_read_works_on_a_read_only_file_in_a_read_only_folder(folders):
    original, copy, out = folders
    _check_reads(_every_read(original, out / "warm.json"))  # loads what the reads import
    read_only(copy.parent)
    before = listing(copy.parent)
    _check_reads(unprivileged(lambda: _every_read(copy, out / "best.json")))
    assert listing(copy.parent) == before
    assert json.loads((out / "best.json").read_text())


def test_reads_leave_nothing_beside_a_database_in_a_writable_folder(tmp_path):
    (tmp_path / "data").mkdir()
    db = make_results(tmp_path / "data" / "results.db")
    before = listing(db.parent)
    _check_reads(_every_read(db, tmp_path / "best.json"))
    after = listing(db.parent)
    assert after == before, sorted(set(after) - set(before))


def test_a_reader_open_before_a_writer_reads_what_the_writer_commits(tmp_path):
    db = make_results(tmp_path / "results.db")
    env = Environment.current()
    reader = ResultsDB.open(db, read_only=True)
    source = open_source(db)
    try:
        assert len(reader.trials()) == 2 and len(source.shapes("ag_gemm", "bf16")) == 1
        with ResultsDB.open(db) as writer:
            writer.record_trial(
                writer.start_sweep("more"), trial(2, env=env, w=workload(n=2048), median_us=9.0)
            )
            # the writer is still connected: what it committed is in its journal, not yet in the file
            assert len(reader.trials()) == 3
            assert len(source.shapes("ag_gemm", "bf16")) == 2
    finally:
        reader.close()
        source.close()


def test_a_journal_of_changes_without_its_index_in_a_read_only_folder_is_named(folders):
    """A copy taken while a writer was connected holds changes in its `-wal` that SQLite can only
    read with the `-shm` beside it: the error says so, and what works."""
    original, copy, _ = folders
    writer = sqlite3.connect(original)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("UPDATE syncopate_sweeps SET name = 'renamed'")
    writer.commit()
    shutil.copy(Path(f"{original}-wal"), Path(f"{copy}-wal"))
    writer.close()
    read_only(copy.parent)

    def read() -> str:
        with pytest.raises(DatabaseError) as e:
            ResultsDB.open(copy, read_only=True)
        return str(e.value)

    message = unprivileged(read)
    assert "results.db-wal beside it holds changes not yet written into the database" in message
    assert "open it once where its folder is writable" in message


# -- writers: refused before they change anything -------------------------------------------------


@pytest.mark.parametrize(
    "what, reason",
    [
        ("file", "the file is read-only for this user"),
        (
            "folder",
            "its folder {folder} is read-only for this user, and SQLite writes its journal beside the file",
        ),
    ],
)
def test_a_sweep_is_refused_a_file_it_cannot_write_before_it_changes_anything(folders, what, reason):
    original, copy, _ = folders
    with sqlite3.connect(copy) as c:  # as a committed file is: not in WAL mode
        c.execute("PRAGMA journal_mode = DELETE")
    open_store(str(original)).close()  # loads what opening imports
    if what == "file":
        copy.chmod(0o444)
    else:
        copy.chmod(0o666)
        copy.parent.chmod(0o555)
    before = listing(copy.parent)

    def write() -> str:
        with pytest.raises(DatabaseError) as e:
            open_store(str(copy))
        return str(e.value)

    message = unprivileged(write)
    assert message.startswith(f"database {copy} cannot be written: {reason.format(folder=copy.parent)}")
    assert "give a file in a writable folder" in message
    assert listing(copy.parent) == before


def test_a_new_file_in_a_read_only_folder_is_refused_when_the_store_opens(folders):
    original, copy, _ = folders
    read_only(copy.parent)
    open_store(str(original.parent / "warm.db")).close()

    def open_new() -> str:
        with pytest.raises(DatabaseError) as e:
            open_store(str(copy.parent / "new.db"))
        return str(e.value)

    message = unprivileged(open_new)
    assert f"cannot be created: the folder {copy.parent} is read-only for this user" in message
    assert not (copy.parent / "new.db").exists()


# -- creation: whole or not at all ---------------------------------------------------------------


def _stop_before_commit(monkeypatch, error: BaseException) -> None:
    """Make the schema's migration raise `error` when it has made every table, before it commits:
    a SIGTERM (the command's handler raises Terminated) or a Ctrl-C at the worst moment."""
    from alembic import command

    real = command.upgrade

    def upgrade(config, revision):
        real(config, revision)
        raise error

    monkeypatch.setattr(command, "upgrade", upgrade)


def _three_pages(dbapi_connection, _record) -> None:
    """A disk that fills up while the schema is made: no SQLite file may grow past three pages,
    fewer than the schema needs, so the migration itself fails with `database or disk is full`."""
    dbapi_connection.execute("PRAGMA max_page_count = 3")


@pytest.mark.parametrize("stop", ["sigterm", "sigint", "disk-full"])
def test_a_creation_stopped_half_way_leaves_no_database_and_the_next_one_works(tmp_path, monkeypatch, stop):
    path = tmp_path / "new.db"
    if stop == "disk-full":
        sa.event.listen(sa.engine.Engine, "connect", _three_pages)
    else:
        _stop_before_commit(monkeypatch, Terminated() if stop == "sigterm" else KeyboardInterrupt())
    try:
        with pytest.raises((KeyboardInterrupt, DatabaseError)) as e:
            store = open_store(str(path))
            store.start_sweep("s", {"name": "s"})  # the first write makes the database
    finally:
        monkeypatch.undo()
        if sa.event.contains(sa.engine.Engine, "connect", _three_pages):
            sa.event.remove(sa.engine.Engine, "connect", _three_pages)
    if stop == "disk-full":
        assert "database or disk is full" in str(e.value)
    assert list(tmp_path.iterdir()) == []  # neither the database nor its temporary file

    store = open_store(str(path))
    try:
        store.prepare_writes()
        assert store.latest_sweep("s") is None
        assert store.start_sweep("s", {"name": "s"}) == 1
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db"]


def test_db_upgrade_makes_a_new_file_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "new.db"
    _stop_before_commit(monkeypatch, KeyboardInterrupt())
    assert main(["db", "upgrade", "--db", str(path)]) == 130
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert main(["db", "upgrade", "--db", str(path)]) == 0
    with ResultsDB.open(path) as db:
        assert db.sweeps() == []


def test_two_creators_of_one_new_file_share_the_first_ones(tmp_path):
    path = tmp_path / "new.db"
    first, second = open_store(str(path)), open_store(str(path))
    try:
        first.prepare_writes()
        sweep_id = first.start_sweep("s", {"name": "s"})
        second.prepare_writes()
        assert second.latest_sweep("s").sweep_id == sweep_id
    finally:
        first.close()
        second.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db"]


# -- files that are not ours, or not whole -------------------------------------------------------


def _another_application(path: Path) -> Path:
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        c.execute("INSERT INTO notes (text) VALUES ('keep me')")
    return path


def test_another_applications_file_is_refused_and_left_exactly_as_it_was(tmp_path):
    path = _another_application(tmp_path / "notes.db")
    before = listing(tmp_path)
    for opening in (
        lambda: ResultsDB.open(path),
        lambda: open_store(str(path)),
        lambda: ResultsDB.open(path, read_only=True),
    ):
        with pytest.raises(SchemaError, match="has no Syncopate tables"):
            opening()
    assert listing(tmp_path) == before  # its journal mode included (a WAL switch rewrites the header)


def _damaged(path: Path) -> Path:
    """A results file cut short, as a copy interrupted half-way leaves it."""
    whole = make_results(path.with_name("whole.db")).read_bytes()
    path.write_bytes(whole[:100])  # the header, and nothing of the pages it announces
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["best", "--db", "{db}"],
        ["export", "--db", "{db}", "--out", "{tmp}/best.json"],
        ["lookup", *SHAPE, "--db", "{db}"],
        ["db", "upgrade", "--db", "{db}"],
        ["tune", "{config}", "--db", "{db}"],
    ],
    ids=["best", "export", "lookup", "upgrade", "tune"],
)
def test_a_damaged_file_is_sent_to_a_new_file_not_to_db_upgrade_on_its_own_path(
    tmp_path, capsys, monkeypatch, args
):
    import syncopate.autotuner.tune as tune_module

    monkeypatch.setattr(
        tune_module, "connect", lambda *a, **k: pytest.fail("Ray started on a damaged database")
    )
    db = _damaged(tmp_path / "results.db")
    config = fixture_sweep(tmp_path)
    code = main([a.format(db=db, tmp=tmp_path, config=config) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "move it aside and give a new file" in err[0], err[0]
    assert f"`syncopate db upgrade --db {db}`" not in err[0]
    advice = err[0].split("`syncopate db upgrade --db ", 1)[1].split("`", 1)[0]
    assert advice == str(tmp_path / "new-results.db")
    assert main(["db", "upgrade", "--db", advice]) == 0  # what it says works
