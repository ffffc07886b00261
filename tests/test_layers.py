"""The layers' promise (the design's "Layers", docs/architecture.md), checked
on the package's source: every import of a package module, at module level
or inside a function, relative or absolute, goes down the declared layer
order or stays within its layer, and no modules import each other in a
circle."""

from __future__ import annotations

import ast
import pathlib

import pytest_memlab

PACKAGE = pathlib.Path(pytest_memlab.__file__).parent

# Lowest first.  A module may import modules of its own layer or of a lower
# one; the first entry whose prefix matches a module's path (relative to the
# package, without ".py") gives its layer.
LAYERS = [
    ("leaves", ["__init__", "devices", "sizes", "atomic_files", "figures"]),
    ("engine", ["engine/"]),
    ("lab", ["lab/"]),
    ("judging, reports", ["judging/", "reports/"]),
    ("measuring", ["measuring/broad_fixtures", "measuring/leak_search", "measuring/leak_suspects",
                   "measuring/measurement", "measuring/memory_kinds", "measuring/out_of_memory", "measuring/__init__", "markers"]),
    ("children", ["children/"]),
    ("a test's run", ["measuring/run", "measuring/plain_run"]),
    ("session", ["session/", "options"]),
    ("top", ["plugin", "__main__"]),
]
# Leaves import nothing of the package, not even each other.
ISOLATED = {"leaves"}
# The package's own __init__ is a leaf for what it defines (__version__);
# its public names (and %load_ext's magics) are imported on first use, a
# facade over the layers that the check does not hold to the leaves' rule
# (its imports still count for circles).
FACADE = "__init__"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return "/".join(rel.parts)


def _layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix.endswith("/") and module.startswith(prefix)):
                return rank
    raise AssertionError(f"pytest_memlab/{module}.py is in no layer: give it one in tests/test_layers.py")


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(dotted: str, modules: dict) -> str | None:
    """The package module a dotted name ('pytest_memlab.x.y[.attr]') names:
    the longest prefix that is a module (a package's __init__ for a folder);
    None for the C module and names outside the package."""
    parts = dotted.split(".")
    if parts[0] != "pytest_memlab" or dotted.startswith("pytest_memlab._engine"):
        return None
    parts = parts[1:]
    while parts:
        name = "/".join(parts)
        if name in modules:
            return name
        if f"{name}/__init__" in modules:
            return f"{name}/__init__"
        parts = parts[:-1]
    return "__init__"


def _edges(modules: dict) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a package module."""
    edges = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = ["pytest_memlab", *path.relative_to(PACKAGE).parent.parts]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                imported = _resolve(target, modules)
                if imported is not None and imported != name:
                    edges.append((name, imported, node.lineno))
    return edges


def _cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _where(edges, a: str, b: str) -> str:
    lines = sorted({line for x, y, line in edges if (x, y) == (a, b)})
    return f"pytest_memlab/{a}.py:{','.join(map(str, lines))} imports {b}"


def test_the_check_reads_the_imports():
    edges = _edges(_modules())
    assert ("measuring/run", "measuring/measurement") in {(a, b) for a, b, _ in edges}
    assert ("children/startup", "__init__") in {(a, b) for a, b, _ in edges}   # from .. import __version__
    assert ("plugin", "session/session") in {(a, b) for a, b, _ in edges}
    assert len({a for a, _, _ in edges}) > 30


def test_every_module_has_a_layer():
    for name in _modules():
        _layer_of(name)


def test_no_circle_of_imports():
    edges = _edges(_modules())
    problems = []
    for component in _cycles(edges):
        inside = set(component)
        problems.append("a circle among " + ", ".join(component) + ": " +
                        "; ".join(_where(edges, a, b) for a, b in sorted({(a, b) for a, b, _ in edges
                                                                          if a in inside and b in inside})))
    assert not problems, "\n".join(problems)


def test_imports_go_down_the_layers():
    edges = _edges(_modules())
    problems = []
    for a, b, line in sorted(set(edges)):
        if a == FACADE:
            continue
        la, lb = _layer_of(a), _layer_of(b)
        if lb > la or (la == lb and LAYERS[la][0] in ISOLATED):
            problems.append(f"pytest_memlab/{a}.py:{line} ({LAYERS[la][0]}) imports "
                            f"pytest_memlab/{b}.py ({LAYERS[lb][0]})")
    assert not problems, f"{len(problems)} imports against the layers:\n" + "\n".join(problems)


def test_the_out_of_memory_observer_attaches_through_the_bridge_hook(monkeypatch):
    """The engine offers a hook as CUDA initialises; the observer (a layer
    above) registers itself there, as the bridge once imported it."""
    import types

    from pytest_memlab.engine import bridge
    from pytest_memlab.measuring.out_of_memory import Observer

    assert Observer.attach_as_cuda_starts in bridge.CUDA_STARTED
    monkeypatch.setattr(Observer, "attached", False)
    attached = []
    torch = types.SimpleNamespace(
        version=types.SimpleNamespace(cuda="12.4"),
        cuda=types.SimpleNamespace(_lazy_call=lambda fn: fn(), is_initialized=lambda: False),
        _C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attached.append))
    failing = []

    def failing_hook(torch):
        failing.append(torch)
        raise RuntimeError("a hook's trouble stays its own")

    monkeypatch.setattr(bridge, "CUDA_STARTED", [failing_hook, *bridge.CUDA_STARTED])
    bridge.Bridge.attach_tracker_when_cuda_starts(types.SimpleNamespace(tracker="attached before"), torch)
    assert failing == [torch]
    assert attached == [Observer._observed] and Observer.attached


def test_judging_and_reports_take_figures_not_the_engine():
    """The verdicts and the reports read figures and words (figures.py, the
    meters' DeviceFigures as given to them); of the engine they read only
    sites turned into lines (engine/attribution.py)."""
    edges = _edges(_modules())
    reach = sorted({f"pytest_memlab/{a}.py:{line} imports {b}" for a, b, line in edges
                    if a.startswith(("judging/", "reports/")) and b.startswith("engine/")
                    and b != "engine/attribution"})
    assert not reach, reach
