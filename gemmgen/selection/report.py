"""Rows (dicts) -> text: an aligned table for people, CSV or JSON for programs; and the geometric
mean that summarizes measurements over several shapes.

The returned text has no trailing newline; the caller prints it.
"""

import csv
import io
import json
import math
from collections.abc import Iterable
from datetime import date, datetime

from gemmgen.errors import GemmgenError

FORMATS = ("table", "csv", "json")
TABLE_CELL_WIDTH = 80  # longer table cells (compiler messages) are cut; csv and json keep all


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_error_column(column: str) -> bool:
    """Relative errors span many decades: rel_error, rel_err, abs_error, error, ..."""
    return "err" in column.lower()


def _table_cell(column: str, value) -> str:
    """One table cell: None as "-", floats to 4 significant digits, errors as 1.23e-06."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if _is_error_column(column):
            return f"{value:.2e}"
        return f"{value:.4g}"
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, dict):
        text = ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    else:
        text = " ".join(str(value).split())  # a multi-line message on one line
    return text if len(text) <= TABLE_CELL_WIDTH else text[:TABLE_CELL_WIDTH - 3] + "..."


def _data_value(value):
    """A value for csv/json: datetimes as ISO strings, dicts as themselves, NaN/inf as None."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[_table_cell(c, row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(_is_number(row.get(c)) for row in rows if row.get(c) is not None) and
               any(row.get(c) is not None for row in rows) for c in columns]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if right else v.ljust(w) for v, w, right in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _csv(rows: list[dict], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        values = [_data_value(row.get(c)) for c in columns]
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (dict, list)) else v
                         for v in values])
    return buffer.getvalue().rstrip("\n")


def _json(rows: list[dict], columns: list[str]) -> str:
    return json.dumps([{c: _data_value(row.get(c)) for c in columns} for row in rows],
                      indent=2, default=str)


def format_rows(rows: list[dict], columns: list[str], fmt: str) -> str:
    """``rows`` as text in ``fmt``, showing only ``columns``, in that order.

    - "table": a header line, a rule, then one line per row; columns aligned (numbers to the
      right); floats to 4 significant digits, or as 1.23e-06 in columns whose name contains
      "err" (rel_error, rel_err); None as "-"; dicts as k=v,k=v (empty: "-"); cells longer than
      TABLE_CELL_WIDTH characters are cut.
    - "csv": a header row, then the values as they are (None as an empty field, dicts as JSON).
    - "json": a list of objects with only ``columns``; datetimes as ISO strings, NaN/inf as null.

    A column missing from a row is None. Raises GemmgenError for an unknown ``fmt``, or a column
    that no row has (when there are rows).
    """
    if fmt not in FORMATS:
        raise GemmgenError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    columns = list(columns)
    if rows:
        known = list(dict.fromkeys(key for row in rows for key in row))
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise GemmgenError(f"unknown column {unknown[0]!r}; columns: {', '.join(known)}")
    return {"table": _table, "csv": _csv, "json": _json}[fmt](rows, columns)


def geometric_mean(values: Iterable[float]) -> float:
    """The geometric mean of positive numbers (ratios to cuBLAS, TFLOP/s): exp of the mean of the
    logs. Raises ValueError where there are no values or one is not > 0."""
    values = list(values)
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"the geometric mean needs one or more positive numbers, not {values!r}")
    return math.exp(math.fsum(map(math.log, values)) / len(values))
