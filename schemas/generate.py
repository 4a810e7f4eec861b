"""The ``.avsc`` file of every version in ``catalog.json``, made from the records' field lists
(``schemas/records/``): ``python -m schemas.generate`` writes them; ``--check`` only says which
differ (``tests/unit/schemas/test_generate.py`` runs it). Then ``python -m schemas.released``
records a new version's id as released."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from schemas.records import BY_NAME

SCHEMA_DIR = Path(__file__).resolve().parent


def text_of(schema: dict) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def generated(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """Each catalog entry's file name and the text made for it."""
    out = {}
    for entry in json.loads((schema_dir / "catalog.json").read_text())["schemas"]:
        record = BY_NAME.get(entry["name"])
        if record is None:
            raise SystemExit(f"catalog.json names {entry['name']}, which no module of schemas/records defines")
        if entry["version"] not in record.versions:
            raise SystemExit(f"catalog.json names {entry['name']} version {entry['version']}; schemas/records has "
                             f"versions {sorted(record.versions)}")
        out[entry["file"]] = text_of(record.schema(entry["version"]))
    return out


def stale(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """The files that differ from what their field lists make (edited by hand, or not made again),
    and the versions a field list has that the catalog gives no id."""
    made = generated(schema_dir)
    out = [name for name, text in made.items()
           if not (schema_dir / name).exists() or (schema_dir / name).read_text() != text]
    listed = {(e["name"], e["version"]) for e in json.loads((schema_dir / "catalog.json").read_text())["schemas"]}
    out += [f"{name} version {v} (no id in catalog.json)" for name, r in BY_NAME.items() for v in r.versions
            if (name, v) not in listed]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m schemas.generate", description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; list what differs, exit 1 if anything does")
    args = p.parse_args(argv)
    if args.check:
        differ = stale()
        print("\n".join(differ) if differ else "every .avsc is as its field list makes it")
        return 1 if differ else 0
    for name, text in generated().items():
        path = SCHEMA_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
