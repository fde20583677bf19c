"""Alembic environment of the results database.

`syncopate db upgrade` passes an open connection, already inside the write transaction that holds
the migration lock, as `config.attributes["connection"]`. Run from the `alembic` command line (to
write a new revision), the database comes from `-x db=URL`.
"""

from __future__ import annotations

from alembic import context

from syncopate.results_db.engine import make_engine
from syncopate.results_db.models import Base
from syncopate.results_db.schema import VERSION_TABLE, include_object
from syncopate.results_db.urls import locate


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=True,
        compare_type=True,
    )


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("db")
    if not url:
        raise SystemExit("give the database as `-x db=URL`")
    engine = make_engine(locate(url))
    with engine.connect() as connection:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()


run_migrations()
