"""Released schemas are frozen: ``released.json`` holds each released schema id's fingerprint
(the SHA-256 of its ``.avsc`` as parsed JSON, keys sorted: any change to a field, a default, a
type or a doc changes it), and ``tests/unit/schemas/test_released.py`` fails when a released
id's file no longer matches it. A subscriber (a deserializer that cached id 46, ClickHouse's
``AvroConfluent``) holds the schema it was given for an id; changing that schema in place makes
it read new records wrongly. A change is a new file and a new id in ``catalog.json``.

``python -m schemas.released`` records the catalog's new ids (the ones a release adds) and
refuses to change a recorded one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SCHEMA_DIR = Path(__file__).parent
LOCK = SCHEMA_DIR / "released.json"


def fingerprint(schema_file: Path) -> str:
    canonical = json.dumps(json.loads(schema_file.read_text()), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def catalog(schema_dir: Path = SCHEMA_DIR) -> dict[int, dict]:
    return {e["id"]: e for e in json.loads((schema_dir / "catalog.json").read_text())["schemas"]}


def locked(lock: Path = LOCK) -> dict[int, str]:
    return {int(k): v for k, v in json.loads(lock.read_text())["released"].items()}


def changed(schema_dir: Path = SCHEMA_DIR, lock: Path = LOCK) -> list[str]:
    """What breaks the freeze: a released id whose file changed, or that left the catalog."""
    entries, out = catalog(schema_dir), []
    for schema_id, print_ in sorted(locked(lock).items()):
        entry = entries.get(schema_id)
        if entry is None:
            out.append(f"schema id {schema_id} was released and is gone from catalog.json: ids stay for old records")
        elif fingerprint(schema_dir / entry["file"]) != print_:
            out.append(f"{entry['file']} (id {schema_id}, released) changed: put the change in a new file with a "
                       f"new id in catalog.json, {entry['name']} version {entry['version'] + 1}")
    return out


def unreleased(schema_dir: Path = SCHEMA_DIR, lock: Path = LOCK) -> list[int]:
    return sorted(set(catalog(schema_dir)) - set(locked(lock)))


def record(schema_dir: Path = SCHEMA_DIR, lock: Path = LOCK) -> list[int]:
    """Add the catalog's new ids to the lock (never touching a recorded one); the ids added."""
    broken = changed(schema_dir, lock)
    if broken:
        raise SystemExit("released schemas changed in place:\n  " + "\n  ".join(broken))
    entries, prints, new = catalog(schema_dir), locked(lock), unreleased(schema_dir, lock)
    prints.update({i: fingerprint(schema_dir / entries[i]["file"]) for i in new})
    doc = json.loads(lock.read_text())["_doc"]
    lock.write_text(json.dumps({"_doc": doc, "released": {str(i): prints[i] for i in sorted(prints)}}, indent=1)
                    + "\n")
    return new


if __name__ == "__main__":
    added = record()
    print(f"recorded as released: {', '.join(map(str, added))}" if added else "nothing new to record")
