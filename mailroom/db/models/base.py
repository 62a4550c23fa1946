"""The declarative base every table derives from, and the helpers the tables share.

All timestamps are ``timestamptz`` in UTC; status columns are check-constrained
text so a status added later is one migration, not an enum type dance.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, Index, MetaData, func, text
from sqlalchemy.orm import DeclarativeBase, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def in_values(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


def references_index(table: str, column: str) -> Index:
    """The index Postgres looks up the rows referring to a deleted row by (its foreign key
    ``column``): without one, each deleted row reads all of ``table``. Partial: only rows
    that refer to something have an entry."""
    return Index(f"ix_{table}_{column}", column, postgresql_where=text(f"{column} IS NOT NULL"))


def now_column() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
