"""The house rules a newcomer can rely on, checked on the tree itself: no module over 400 lines
(gpufleet's, its tests' and its benchmarks'), no import loop among gpufleet's modules (every
import statement counted, those inside functions too), and tests that share code through
``tests.support``, never by importing one another."""

from __future__ import annotations

import ast
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
