"""Imports go one way across `functional_gen/` (issue 39, item 5; DESIGN.md's layout): no import
circle between modules, and no import of a `functional_gen` module inside a function (which is
how a circle hides). Checked on the source with `ast`, so that nothing is imported to check it.

A module's imports are every `import`/`from ... import` in its file (inside functions too,
outside `if TYPE_CHECKING:`), each resolved to the most specific module file it names:
`from .processors.base import X` is an arrow to `functional_gen.processors.base`, `from . import
x` to the submodule `x` when there is one. A circle is a strongly connected component of these
arrows with more than one module (or a module importing itself).

Known exceptions are listed below, one comment each; the lists may only shrink. A circle that is
smaller than a listed one (some arrows of it removed) passes; a new circle, or a listed one that
grew, fails.
"""

import ast
from pathlib import Path

import functional_gen as fg

PACKAGE = Path(fg.__file__).parent

# Known circles and function-level imports of `functional_gen` modules: none. Issue 39 removed the
# last of them (generation's beam search <-> samplers <-> step and loop <-> sequence state, models'
# llama <-> quantization, structured's grammar/pda/processor/regex, and the per-command imports of
# cli.py, loading and sharding). Add an entry here only with a comment saying why it must be.
KNOWN_CIRCLES: list[set[str]] = []
KNOWN_FUNCTION_IMPORTS: set[tuple[str, str]] = set()

# Packages whose imports inside functions are deferred on purpose (heavy or optional third-party
# dependencies; the importing line says why in a comment). Not checked: only `functional_gen`
# modules are. Listed here so that the reader knows they are allowed, not forgotten.
DEFERRED_THIRD_PARTY = (
    "outlines_core",  # Rust regex -> DFA; loaded only when a regex is compiled
    "referencing",  # JSON Schema `$ref` resolution; only for schemas with references
    "lark",  # grammar parsing; only for `Grammar`
    "llguidance",  # GBNF -> Lark conversion; only for `Grammar.from_gbnf`
    "scipy",  # sparse graph searches; only when an automaton is built
    "torch",  # transformers' checkpoints; optional (tests/test_no_torch.py)
    "transformers",
    "gguf",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The most specific `functional_gen` module file that `name` names, or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> list[tuple[str, bool]]:
    """`(imported module, inside a function)` for each `functional_gen` module `module` imports."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{alias.name}" for alias in node.names]
        else:
            names = []
            inner = in_function or isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
        for name in names:
            resolved = _resolve(name) if name.startswith("functional_gen") else None
            if resolved is not None and resolved != module:
                out.append((resolved, in_function))

    visit(ast.parse(path.read_text()), False)
    return out


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _graph() -> dict[str, set[str]]:
    return {m: {target for target, _ in _imports(m)} for m in MODULES}


def test_resolution_finds_real_arrows():
    """The walk sees what it should: `grammar` imports `grammar_rules`, at the top."""
    assert ("functional_gen.structured.grammar_rules", False) in _imports(
        "functional_gen.structured.grammar"
    )
    assert "functional_gen.processors.base" in _graph()["functional_gen.structured.processor"]


def test_circle_detection_on_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [{"a", "b", "c"}]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_new_import_circle():
    new = [
        sorted(circle)
        for circle in _circles(_graph())
        if not any(circle <= known for known in KNOWN_CIRCLES)
    ]
    assert not new, f"import circles (break them, see the module docstring): {new}"


def test_no_new_function_level_import_of_functional_gen():
    found = {
        (module, target)
        for module in MODULES
        for target, in_function in _imports(module)
        if in_function
    }
    new = sorted(found - KNOWN_FUNCTION_IMPORTS)
    assert not new, f"imports of functional_gen modules inside functions: {new}"


def test_structured_has_no_circle_and_no_function_level_import():
    """structured/ is done (issue 39): no exception applies to it."""
    assert not [c for c in _circles(_graph()) if any(".structured." in m for m in c)]
    assert not [k for k in KNOWN_FUNCTION_IMPORTS if ".structured" in k[0]]
    assert not any(".structured" in m for c in KNOWN_CIRCLES for m in c)
