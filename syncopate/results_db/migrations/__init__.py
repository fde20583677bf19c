"""Alembic migrations of the results database (run by `syncopate db upgrade`)."""
