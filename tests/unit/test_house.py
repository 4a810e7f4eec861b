"""The house rules a newcomer can rely on, checked on the tree itself: no module over 400 lines
(gpufleet's, its tests' and its benchmarks'), no import loop among gpufleet's modules (every
import statement counted, those inside functions too), the layers that ``docs/architecture.md``
draws (its table of units and what each may import, read from the page itself; Faust only where
the page says), and tests that share code through ``tests.support``, never by importing one
another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpufleet", "producers", "streams", "sinks", "schemas", "kafka_client")
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # made from the kubelet's .proto by `make proto`
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name.endswith(GENERATED):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (``from a import b`` counts ``a.b`` where that is a
    module, else ``a``)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    out.add(target)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def every_python_file() -> list[Path]:
    return [p for folder in (*PACKAGES, "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")
            if not p.name.endswith(GENERATED) and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def test_no_module_is_over_400_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in every_python_file()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}


def test_tests_share_code_through_tests_support_only():
    """A test module imports gpufleet's code and ``tests.support``, never another test module."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.") \
                    and not node.module.startswith("tests.support"):
                found.append(f"{path.relative_to(ROOT)}: from {node.module}")
    assert found == []


def test_no_import_loop():
    known = modules()
    graph = {name: imports_of(name, path, known) - {p for p in PACKAGES} for name, path in known.items()}
    assert cycles(graph) == []


def test_the_loop_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- the layers ---------------------------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
EVERYTHING, NOTHING = "everything", "nothing of ours"


def unit_of(path: str) -> str:
    """A backticked path of the page (``streams/windows/``, ``streams/settings.py``) as a
    module-name prefix (``streams.windows``, ``streams.settings``)."""
    return path.removesuffix("/").removesuffix(".py").replace("/", ".")


def layer_table(text: str) -> dict[str, set[str] | None]:
    """The page's table of units: unit -> the units it may import (None: everything)."""
    section = text.split("## The packages, and what each may import", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 3:
            continue  # the stages' table, further down
        unit, allowed = unit_of(re.fullmatch(r"`([^`]+)`", cells[0]).group(1)), cells[2]
        table[unit] = None if allowed == EVERYTHING else (
            set() if allowed == NOTHING else {unit_of(p) for p in re.findall(r"`([^`]+)`", allowed)})
    return table


def faust_importers(text: str) -> set[str]:
    sentence = re.search(r"Faust is imported by (.*?) only", text, re.DOTALL).group(1)
    return {unit_of(p) for p in re.findall(r"`([^`]+)`", sentence)}


def owner(module: str, units) -> str | None:
    """The unit of ``module``: the longest unit that is it or holds it."""
    held = [u for u in units if module == u or module.startswith(u + ".")]
    return max(held, key=len) if held else None


def layer_breaches(graph: dict[str, set[str]], table: dict[str, set[str] | None]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        mine = owner(module, table)
        if mine is None:
            out.append(f"{module}: in no unit of the table")
            continue
        allowed = table[mine]
        for target in sorted(targets):
            theirs = owner(target, table)
            if theirs != mine and allowed is not None and theirs not in allowed:
                out.append(f"{module} imports {target}: {mine} may not import {theirs}")
    return out


def test_the_layers_are_those_the_architecture_page_draws():
    text = ARCHITECTURE.read_text()
    table = layer_table(text)
    known = modules()
    assert set(PACKAGES) <= set(table), "every top package has its row"
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert layer_breaches(graph, table) == []
    # Units of the table import each other one way only.
    units = {u: {owner(t, table) for m, ts in graph.items() if owner(m, table) == u for t in ts} - {u}
             for u in table}
    assert cycles(units) == []


def test_faust_is_imported_only_where_the_page_says():
    allowed = faust_importers(ARCHITECTURE.read_text())
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "faust" or n.startswith("faust.") for n in names) and owner(name, allowed) is None:
                found.append(name)
    assert sorted(set(found)) == []


def test_the_layer_check_finds_a_breach():
    table = layer_table("## The packages, and what each may import\n\n| unit | owns | may import |\n|---|---|---|\n"
                        "| `a/` | low | nothing of ours |\n| `a/b.py` | high | `a/` |\n| `c/` | top | everything |\n")
    assert table == {"a": set(), "a.b": {"a"}, "c": None}
    graph = {"a.x": {"a.b"}, "a.b": {"a.x"}, "c.y": {"a.x", "a.b"}}
    assert layer_breaches(graph, table) == ["a.x imports a.b: a may not import a.b"]


def test_every_module_a_docstring_names_exists():
    """A ``package.module`` or ``package.module.name`` in a docstring or comment of ours names
    something that is there: a restructuring leaves no reader following a dead name."""
    known = modules()
    dead, pattern = [], re.compile(r"``((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)``")
    for name, path in sorted(known.items()):
        for ref in set(pattern.findall(path.read_text())):
            parts = ref.split(".")
            held = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known), default=0)
            if held == 0:
                dead.append(f"{name}: {ref}")
                continue
            tree = ast.parse(known[".".join(parts[:held])].read_text())
            defined = {n.name for n in ast.walk(tree)
                       if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)}
            defined |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            defined |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                        if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
            if held < len(parts) and parts[held] not in defined:
                dead.append(f"{name}: {ref}")
    assert dead == []


def test_every_package_is_installed():
    """A wheel holds the packages pyproject.toml lists, not what an editable install finds: a
    package left off works here and is missing where gpufleet is installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")}
    assert found == listed


def test_every_package_says_what_it_offers():
    """A package's ``__init__.py`` opens with what it holds, as the modules' docstrings do."""
    silent = [str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")
              if not p.name.endswith(GENERATED) and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert silent == []
