"""The architecture as the project enforces it (docs/architecture.md): the import-linter
contracts of pyproject.toml (the floors, bottom to top), no import cycle at all counting
function-level imports, and no private name imported across packages (a package is the
first folder under einfuse/, or a top-level module).  The walk reads every import
statement of src/einfuse with ``ast``, wherever it stands in a module."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "einfuse"


def _modules() -> Dict[str, Path]:
    """Every module of einfuse by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _target(name: str, modules: Dict[str, Path]) -> str:
    """The module ``name`` denotes (an attribute's module where it names none)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(modules: Dict[str, Path]) -> List[Tuple[str, str, str, int]]:
    """(importer, imported module, name or "", line) for every import of einfuse."""
    found = []
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "einfuse":
                        found.append((module, _target(alias.name, modules), "", node.lineno))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] != "einfuse":
                    continue
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    if whole in modules:
                        found.append((module, whole, "", node.lineno))
                    else:
                        found.append((module, _target(base, modules), alias.name, node.lineno))
    return found


def _cycles(modules, imports) -> List[List[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm)."""
    edges: Dict[str, Set[str]] = {m: set() for m in modules}
    for source, target, _, _ in imports:
        if target and target != source:
            edges[source].add(target)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules)))
    try:
        for module in sorted(modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


@functools.lru_cache(maxsize=None)
def _source_imports() -> Tuple[Dict[str, Path], Tuple[Tuple[str, str, str, int], ...]]:
    """The modules and their imports, parsed once per process (three tests read them:
    about 2 s of CPU each time)."""
    modules = _modules()
    return modules, tuple(_imports(modules))


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_cycle_counting_function_level_imports():
    modules, imports = _source_imports()
    cycles = _cycles(modules, list(imports))
    assert not cycles, "import cycles (every import statement counted):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_no_private_name_is_imported_across_packages():
    crossing = [f"{source} imports {name} from {target} (line {line})"
                for source, target, name, line in _source_imports()[1]
                if name.startswith("_") and not name.startswith("__")
                and _package(source) != _package(target)]
    assert not crossing, "\n".join(crossing)


def test_the_walk_sees_function_level_imports():
    """The walk counts an import inside a function (the way a cycle hides from Python),
    so the cycle test above can fail: runtime/kernel.py's lazy import of the prepared
    repeat path is one."""
    imports = _source_imports()[1]
    assert ("einfuse.runtime.kernel", "einfuse.runtime.repeat", "prepare") in \
        {(s, t, n) for s, t, n, _ in imports}


def test_the_import_linter_contracts_are_kept(tmp_path):
    """``lint-imports`` with pyproject.toml's contracts (import-linter is in the test
    extra); its cache goes to a temporary folder."""
    environment = dict(os.environ, PYTHONPATH=str(SOURCE.parent))
    command = [sys.executable, "-c",
               "import sys; from importlinter.cli import lint_imports_command; "
               "sys.exit(lint_imports_command())",
               str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
