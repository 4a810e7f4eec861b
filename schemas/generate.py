"""The ``.avsc`` files of ``catalog.json`` and the records' field lists (``schemas/records/``), held
together. A version not yet released is made from its list: ``python -m schemas.generate`` writes
it, then ``python -m schemas.released`` records its id as released. A released version's file is
never written again, not even its docs (``schemas.released``: a subscriber holds that text for its
id); its list must make it on everything a reader resolves by (names, types, defaults, order,
namespaces: the schema less its docs), so the list stays the one place the record is written, and
a field's one doc there goes into the record's next version. ``--check`` only says what differs
(``tests/unit/schemas/test_generate.py`` runs it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from schemas.records import BY_NAME
from schemas.released import LOCK, locked

SCHEMA_DIR = Path(__file__).resolve().parent


def text_of(schema: dict) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def without_docs(node):
    if isinstance(node, dict):
        return {k: without_docs(v) for k, v in node.items() if k != "doc"}
    if isinstance(node, list):
        return [without_docs(v) for v in node]
    return node


def generated(schema_dir: Path = SCHEMA_DIR) -> dict[str, tuple[int, dict]]:
    """Each catalog entry's file name, its id and the schema its field list makes."""
    out = {}
    for entry in json.loads((schema_dir / "catalog.json").read_text())["schemas"]:
        record = BY_NAME.get(entry["name"])
        if record is None:
            raise SystemExit(f"catalog.json names {entry['name']}, which no module of schemas/records defines")
        if entry["version"] not in record.versions:
            raise SystemExit(f"catalog.json names {entry['name']} version {entry['version']}; schemas/records has "
                             f"versions {sorted(record.versions)}")
        out[entry["file"]] = (entry["id"], record.schema(entry["version"]))
    return out


def stale(schema_dir: Path = SCHEMA_DIR, lock: Path = LOCK) -> list[str]:
    """The files that differ from what their field lists make (a released one: but for its docs;
    one not released: to the byte), and the versions a field list has that the catalog gives no id."""
    released, out = locked(lock), []
    for name, (schema_id, schema) in generated(schema_dir).items():
        path = schema_dir / name
        if not path.exists():
            out.append(name)
        elif schema_id in released:
            if without_docs(json.loads(path.read_text())) != without_docs(schema):
                out.append(name)
        elif path.read_text() != text_of(schema):
            out.append(name)
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
    released = locked()
    for name, (schema_id, schema) in generated().items():
        path = SCHEMA_DIR / name
        if schema_id in released:
            continue  # frozen as released: --check holds it to its list
        if not path.exists() or path.read_text() != text_of(schema):
            path.write_text(text_of(schema))
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
