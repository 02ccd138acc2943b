"""The shape of `functional_gen/generation/`: imports go one way (no circle between its modules)
and no function imports a `functional_gen` module (read with `ast`, nothing is run)."""

import ast
from pathlib import Path

import functional_gen

PACKAGE = Path(functional_gen.__file__).parent
GENERATION = PACKAGE / "generation"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.ImportFrom | ast.Import, module: str, is_package: bool) -> list[str]:
    """The `functional_gen` modules an import statement names (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("functional_gen")]
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("functional_gen"):
        return []
    # `from . import x` names submodule x when it is one
    names = [f"{target}.{a.name}" for a in node.names]
    return [n for n in names if _is_module(n)] or [target]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph():
    edges, inner = {}, []
    for path in sorted(GENERATION.glob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(_imported(node, module, path.name == "__init__.py"))
        edges[module] = {t for t in targets if t.startswith("functional_gen.generation.")}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and _imported(
                        node, module, path.name == "__init__.py"
                    ):
                        inner.append(f"{module}.{fn.name} (line {node.lineno})")
    return edges, inner


def test_no_import_circle_inside_generation():
    edges, _ = _graph()
    edges.pop("functional_gen.generation", None)  # the package's face re-exports its modules
    state, path, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == "open":
                circles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert circles == []
    assert "functional_gen.generation.search" in edges  # the walk did read the package


def test_no_function_imports_a_functional_gen_module():
    _, inner = _graph()
    assert inner == []
