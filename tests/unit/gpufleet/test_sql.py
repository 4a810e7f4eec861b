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


def test_a_table_shows_what_would_drive_the_terminal_or_forge_a_line_escaped():
    """A job's owner names their job (Slurm's JobName, stored as the workflow's ``job_name``): one
    named ``a\\x1b[2J`` cleared the screen of the operator who selected it, ``\\x1b]52;c;...\\x07``
    would set their clipboard, and a newline drew a row of the owner's choosing. The table is for a
    terminal, so what is not printable is shown as its escape; CSV and JSON carry the data as it is
    (JSON escapes it by its own rules)."""
    hostile = "train\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\nfake  row\u2028"
    out = format_table(["job_name", "n\x1b[31m"], [(hostile, 1)])
    assert out.isprintable() is False and all(line.isprintable() for line in out.splitlines())
    assert out.splitlines()[2].startswith(r"train\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\nfake  row\u2028")
    assert out.splitlines()[0].split() == ["job_name", r"n\x1b[31m"] and out.splitlines()[-1] == "(1 row)"
    assert format_csv(["j"], [(hostile,)]).splitlines()[1].startswith('"train\x1b[2J')
    assert json.loads(format_json(["j"], [(hostile,)])) == [{"j": hostile}]
