import json

from gpufleet.sql import format_csv, format_json, format_table


def test_table_aligns_numbers_right_and_counts_rows():
    out = format_table(["name", "n"], [("a", 1), ("bbb", 22.5), ("c", None)]).splitlines()
    assert out[0].split() == ["name", "n"]
    assert out[2].endswith("   1") and out[3].endswith("22.5") and out[4].endswith("NULL")
    assert out[-1] == "(3 rows)"


def test_csv_and_json():
    assert format_csv(["a", "b"], [(1, None)]).splitlines() == ["a,b", "1,"]
    assert json.loads(format_json(["a"], [(1,)])) == [{"a": 1}]
