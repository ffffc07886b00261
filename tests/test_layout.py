"""The layout's promises, checked: the engine package is the only importer
of the C module, the module's stub declares exactly what the module has,
plugin.py holds hooks only, and each shared concept is defined once."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest_memlab
from pytest_memlab import _engine

PACKAGE = pathlib.Path(pytest_memlab.__file__).parent


def _imports_of(path: pathlib.Path) -> set[str]:
    """Names a module imports, as 'pytest_memlab.x.y' (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    here = ["pytest_memlab", *path.relative_to(PACKAGE).parent.parts]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def test_only_the_engine_package_imports_the_c_module():
    importers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if "pytest_memlab._engine" in _imports_of(p))
    assert importers, "nothing imports the engine: the check reads imports wrongly"
    assert all(name.startswith("engine/") for name in importers), importers


def test_the_stub_declares_exactly_what_the_module_has():
    tree = ast.parse((PACKAGE / "_engine.pyi").read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if not any(getattr(d, "id", None) == "type_check_only" for d in node.decorator_list):
                declared.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
    public = {name for name in dir(_engine) if not name.startswith("__")}
    assert declared == public, (sorted(public - declared), sorted(declared - public))


def test_the_plugin_module_holds_hooks_only():
    from pytest_memlab import plugin

    functions = {name for name, f in vars(plugin).items()
                 if inspect.isfunction(f) and f.__module__ == plugin.__name__}
    assert functions == {"pytest_addoption", "pytest_load_initial_conftests", "pytest_configure"}
    assert hasattr(plugin, "memlab")   # and the fixture
    methods = {name for name, f in vars(plugin.MemlabPlugin).items() if inspect.isfunction(f)}
    assert {m for m in methods if not m.startswith("pytest_")} == {"__init__", "running"}


def test_shared_concepts_are_defined_once():
    from pytest_memlab import options
    from pytest_memlab.engine import slots, tracing
    from pytest_memlab.judging import verdicts

    assert options.LEAK_POLICIES is verdicts.LEAK_POLICIES
    assert (tracing.PHASE_FORWARD, tracing.PHASE_BACKWARD, tracing.PHASE_STEP) == (
        _engine.PHASE_FORWARD, _engine.PHASE_BACKWARD, _engine.PHASE_STEP)
    assert slots.slot_of("cpu") == _engine.SLOT_CPU and slots.slot_of("cuda:3") == _engine.SLOT_CPU + 4
    # each of these names is assigned at the top of exactly one module
    for name in ("LEAK_POLICIES", "DEFAULT_TOLERANCE", "PHASE_FORWARD", "SLOT_CPU", "ALLOC_LOG_MAX"):
        owners = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name or
                                                          name in [getattr(e, "id", None) for e in getattr(t, "elts", [])]
                                                          for t in n.targets)
                         for n in ast.parse(p.read_text()).body)]
        assert len(owners) == 1, (name, owners)
    unparks = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if any(isinstance(n, ast.FunctionDef) and n.name == "unpark" for n in ast.parse(p.read_text()).body)]
    assert unparks == ["engine/backend.py"]
