"""Alembic migrations (a package so that it can be installed next to ``service``)."""
