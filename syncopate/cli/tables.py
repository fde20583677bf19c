"""How a command prints a table: one layout for a terminal, one for a pipe, one for `--json`.

- On a terminal: the compact columns (with `--wide`, all of them) as a table sized to the
  terminal. Its key columns (the workload's shape, the chosen configuration) are never wrapped,
  cut or dropped, and neither is any other value: where the terminal is too narrow for the table,
  each row is printed as a block of a few lines instead (the key columns, then `name value` pairs).
- Piped or redirected: a header line, then one line per row, columns aligned with two spaces; no
  box drawing and no wrapping, so that grep, cut and less see whole rows.
- `--json`: every row as an object with every field, numbers as numbers (the compact and wide
  columns alike).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Column", "Listing", "show"]

_GAP = 2
"""Characters between two columns of the terminal table (a column's right padding and the divider)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """One column of a listing."""

    name: str
    """The header."""
    key: bool = False
    """Identifies the row (a workload, a configuration): the first key column heads each block of
    the narrow layout."""
    wide: bool = False
    """Shown only with `--wide` (always in `--json`)."""
    numeric: bool = False
    """Right-aligned on a terminal."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Listing:
    """A table to print: its cells as text, and the same rows as JSON records."""

    title: str
    columns: tuple[Column, ...]
    rows: Sequence[Sequence[str]] = ()
    """One text per column, in the order of `columns`."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """What `--json` prints: one object per row, every field."""

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"row {i} has {len(row)} cells for {len(self.columns)} columns")

    def visible(self, wide: bool) -> tuple[list[Column], list[list[str]]]:
        """The columns shown (all with `wide`, else the compact ones) and their cells."""
        keep = [i for i, c in enumerate(self.columns) if wide or not c.wide]
        return [self.columns[i] for i in keep], [[str(row[i]) for i in keep] for row in self.rows]


def show(listing: Listing, console: Console, *, wide: bool = False, as_json: bool = False) -> None:
    """Print `listing` on `console` in the layout its output calls for (see the module docstring)."""
    if as_json:
        console.out(json.dumps(listing.records, indent=1), highlight=False)
        return
    columns, rows = listing.visible(wide)
    if not console.is_terminal:
        _plain(listing.title, columns, rows, console)
        return
    if listing.title:
        console.print(listing.title, highlight=False, markup=False)
    widths = _fit(columns, rows, console.width)
    if widths is None:
        _blocks(columns, rows, console)
    else:
        _table(columns, rows, widths, console)


def _natural(column: Column, cells: list[str]) -> tuple[int, int]:
    """(width with the header on one line, narrowest width that wraps no value and no header word)."""
    longest = max((len(c) for c in cells), default=0)
    word = max((len(w) for w in column.name.split()), default=0)
    return max(longest, len(column.name)), max(longest, word)


def _fit(columns: list[Column], rows: list[list[str]], width: int) -> list[int] | None:
    """Column widths that fit `width` without wrapping a value (headers may wrap at their spaces),
    or None where no such widths exist."""
    sizes = [_natural(c, [row[i] for row in rows]) for i, c in enumerate(columns)]
    widths = [natural for natural, _ in sizes]
    gaps = _GAP * (len(columns) - 1)
    excess = sum(widths) + gaps - width
    if excess <= 0:
        return widths
    if sum(least for _, least in sizes) + gaps > width:
        return None
    while excess > 0:  # narrow the headers with the most room to spare, one character at a time
        i = max(range(len(widths)), key=lambda j: widths[j] - sizes[j][1])
        widths[i] -= 1
        excess -= 1
    return widths


def _table(columns: list[Column], rows: list[list[str]], widths: list[int], console: Console) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), expand=False)
    for column, width in zip(columns, widths):
        table.add_column(
            column.name,
            width=width,
            justify="right" if column.numeric else "left",
            header_style="bold",
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def _blocks(columns: list[Column], rows: list[list[str]], console: Console) -> None:
    """Each row as a block: its first key column as a heading, its other key columns each on a line
    of their own, then `name value` pairs joined by ` · `, as many to a line as the width takes.
    No value is broken: one longer than the line runs past it."""
    from rich.text import Text

    head = next((i for i, c in enumerate(columns) if c.key), 0)
    keys = [i for i, c in enumerate(columns) if c.key and i != head]
    pairs = [i for i, c in enumerate(columns) if not c.key and i != head]
    for n, row in enumerate(rows):
        if n:
            console.line()
        lines = [Text(row[head], style="bold")]
        lines += [Text(f"  {row[i]}") for i in keys]
        current = ""
        for i in pairs:
            item = f"{columns[i].name} {row[i]}"
            if current and 2 + len(current) + 3 + len(item) > console.width:
                lines.append(Text(f"  {current}"))
                current = ""
            current = f"{current} · {item}" if current else item
        if current:
            lines.append(Text(f"  {current}"))
        for line in lines:
            console.print(line, soft_wrap=True)


def _plain(title: str, columns: list[Column], rows: list[list[str]], console: Console) -> None:
    widths = [_natural(c, [row[i] for row in rows])[0] for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(w) if column.numeric else cell.ljust(w)
            for cell, w, column in zip(cells, widths, columns)
        ).rstrip()

    if title:
        console.out(title, highlight=False)
    console.out(line([c.name for c in columns]), highlight=False)
    for row in rows:
        console.out(line(row), highlight=False)
