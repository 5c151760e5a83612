"""format_rows: the aligned table, CSV and JSON, with values written out by hand."""

import csv
import io
import json
from datetime import datetime, timezone

import pytest

from gemmgen.errors import GemmgenError
from gemmgen.selection.report import FORMATS, format_rows

ROWS = [
    {"kernel": "warp_128x128x8_w64x32_t8x8_b2_fp32", "tflops": 41.02345, "median_ms": 3.350123,
     "rel_error": 1.23456e-06, "registers": 128, "tag": None, "params": {"BM": 128, "BK": 8},
     "created_at": datetime(2026, 11, 21, 12, 30, tzinfo=timezone.utc), "message": "max error\nat (7, 3)"},
    {"kernel": "cublas_fp32", "tflops": 51.5, "median_ms": 2.668, "rel_error": None, "registers": None,
     "tag": "bench", "params": {}, "created_at": datetime(2026, 11, 21, 12, 31, 5, tzinfo=timezone.utc),
     "message": ""},
]
COLUMNS = ["kernel", "tflops", "median_ms", "rel_error", "registers", "tag"]


def test_table_aligns_columns_and_formats_numbers():
    expected = "\n".join([
        "kernel                              tflops  median_ms  rel_error  registers  tag",
        "----------------------------------  ------  ---------  ---------  ---------  -----",
        "warp_128x128x8_w64x32_t8x8_b2_fp32   41.02       3.35   1.23e-06        128  -",
        "cublas_fp32                           51.5      2.668          -          -  bench",
    ])
    assert format_rows(ROWS, COLUMNS, "table") == expected


def test_table_cells_for_large_small_and_odd_values():
    rows = [{"x": 123456.7, "y": 0.000123456, "abs_error": 3.0, "when": ROWS[0]["created_at"],
             "params": {"BM": 128, "BK": 8}, "message": "line one\n  line two", "flag": True},
            {"x": 0.0, "y": -1.25, "abs_error": 1e-10, "when": None, "params": {}, "message": "m" * 200,
             "flag": False}]
    lines = format_rows(rows, ["x", "y", "abs_error", "when", "params", "message", "flag"], "table").splitlines()
    assert len(lines) == 4
    cells = [line.split("  ") for line in lines[2:]]
    first = [c.strip() for c in cells[0] if c.strip()]
    assert first == ["1.235e+05", "0.0001235", "3.00e+00", "2026-11-21T12:30:00+00:00", "BM=128,BK=8",
                     "line one line two", "True"]
    second = [c.strip() for c in cells[1] if c.strip()]
    assert second[:5] == ["0", "-1.25", "1.00e-10", "-", "-"]
    assert second[5] == "m" * 77 + "..."
    assert second[6] == "False"


def test_error_columns_of_any_spelling_use_exponents():
    rows = [{"rel_err": 2.5e-4, "Error": 0.5, "ratio": 2.5e-4}]
    assert format_rows(rows, ["rel_err", "Error", "ratio"], "table").splitlines()[2] == \
        "2.50e-04  5.00e-01  0.00025"


def test_table_right_aligns_numbers_and_left_aligns_text():
    rows = [{"name": "a", "n": 5}, {"name": "bbbbbb", "n": 12345}]
    assert format_rows(rows, ["name", "n"], "table").splitlines() == [
        "name        n",
        "------  -----",
        "a           5",
        "bbbbbb  12345",
    ]


def test_table_of_no_rows_is_the_header():
    assert format_rows([], ["kernel", "tflops"], "table") == "kernel  tflops\n------  ------"


def test_csv_has_a_header_and_exact_values():
    text = format_rows(ROWS, COLUMNS + ["params", "created_at", "message"], "csv")
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed == [
        ["kernel", "tflops", "median_ms", "rel_error", "registers", "tag", "params", "created_at", "message"],
        ["warp_128x128x8_w64x32_t8x8_b2_fp32", "41.02345", "3.350123", "1.23456e-06", "128", "",
         '{"BM": 128, "BK": 8}', "2026-11-21T12:30:00+00:00", "max error\nat (7, 3)"],
        ["cublas_fp32", "51.5", "2.668", "", "", "bench", "{}", "2026-11-21T12:31:05+00:00", ""],
    ]
    assert text.splitlines()[0] == "kernel,tflops,median_ms,rel_error,registers,tag,params,created_at,message"
    assert not text.endswith("\n")


def test_json_keeps_only_the_columns_asked_for():
    data = json.loads(format_rows(ROWS, ["kernel", "tflops", "rel_error", "params", "created_at"], "json"))
    assert data == [
        {"kernel": "warp_128x128x8_w64x32_t8x8_b2_fp32", "tflops": 41.02345, "rel_error": 1.23456e-06,
         "params": {"BM": 128, "BK": 8}, "created_at": "2026-11-21T12:30:00+00:00"},
        {"kernel": "cublas_fp32", "tflops": 51.5, "rel_error": None, "params": {},
         "created_at": "2026-11-21T12:31:05+00:00"},
    ]
    assert list(data[0]) == ["kernel", "tflops", "rel_error", "params", "created_at"]


def test_json_writes_nan_as_null_so_that_it_stays_json():
    text = format_rows([{"rel_error": float("nan"), "tflops": float("inf")}], ["rel_error", "tflops"], "json")
    assert json.loads(text) == [{"rel_error": None, "tflops": None}]
    assert "NaN" not in text and "Infinity" not in text
    assert format_rows([], ["kernel"], "json") == "[]"


def test_an_unknown_format_lists_the_allowed_ones():
    assert FORMATS == ("table", "csv", "json")
    with pytest.raises(GemmgenError, match="unknown format 'xml'; formats: table, csv, json"):
        format_rows(ROWS, COLUMNS, "xml")


def test_an_unknown_column_lists_the_columns():
    with pytest.raises(GemmgenError, match="unknown column 'gflops'; columns: kernel, tflops"):
        format_rows(ROWS, ["kernel", "gflops"], "table")


def test_rows_from_the_database_format(tmp_path):
    from gemmgen.store.db import ResultsDB

    with ResultsDB(f"sqlite:///{tmp_path / 'r.db'}") as db:
        k = db.kernel(name="cublas_fp32", family="cublas", precision="fp32", arch="sm_90", params={})
        d = db.device(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132, clock_mhz=1980,
                      memory_clock_mhz=2619, driver_version="580.159.04", cuda_version="13.0")
        p = db.problem(4096, 4096, 4096, 1.0, 0.0)
        db.record(kernel_id=k, device_id=d, problem_id=p, status="ok", median_ms=2.6687, tflops=51.5012,
                  rel_error=9.87e-8)
        rows = [r.as_dict() for r in db.results()]
    assert format_rows(rows, ["kernel", "M", "tflops", "rel_error", "status"], "table").splitlines()[2] == \
        "cublas_fp32  4096    51.5   9.87e-08  ok"
    assert json.loads(format_rows(rows, ["device", "median_ms"], "json")) == [
        {"device": "NVIDIA H100 80GB HBM3", "median_ms": 2.6687}]
