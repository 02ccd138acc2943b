"""Imports go one way (DESIGN.md, package layout): structured/ never imports loading/ or
generation code, processors/ never imports structured/, and automaton.py does not import
byte_dfa.py (which builds on it). Checked on the source with `ast`, so that a lazy import
inside a function counts too."""

import ast
import dataclasses
from pathlib import Path

import functional_gen as fg

PACKAGE = Path(fg.__file__).parent


def _imports(path: Path) -> set[str]:
    """The modules a file imports, resolved to absolute `functional_gen...` names."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out |= {f"{name}.{alias.name}" for alias in node.names}
    return out


def test_structured_does_not_import_loading_or_generation():
    for path in (PACKAGE / "structured").rglob("*.py"):
        bad = {
            m
            for m in _imports(path)
            if m.startswith(
                (
                    "functional_gen.loading",
                    "functional_gen.generation",
                    "functional_gen.step",
                    "functional_gen.cli",
                )
            )
        }
        assert not bad, (path.name, bad)


def test_processors_do_not_import_structured():
    for path in (PACKAGE / "processors").glob("*.py"):
        bad = {m for m in _imports(path) if m.startswith("functional_gen.structured")}
        assert not bad, (path.name, bad)


def test_automaton_does_not_import_byte_dfa():
    imports = _imports(PACKAGE / "structured" / "automaton.py")
    assert not any(m.startswith("functional_gen.structured.byte_dfa") for m in imports), imports
    assert "functional_gen.structured.automaton" in _imports(PACKAGE / "structured" / "byte_dfa.py")


def test_public_names_still_work():
    from functional_gen.cache import cache_dir
    from functional_gen.loading.default_model import cache_dir as old_cache_dir

    assert old_cache_dir is cache_dir
    for name in ("Regex", "JsonSchema", "Choice", "Grammar"):
        assert getattr(fg.processors, name) is getattr(fg.structured, name)
        assert name in dir(fg.processors)


def test_constraint_base_holds_no_fields_and_no_method_is_overridden():
    # Equinox's abstract/final pattern (issue 39): `AbstractConstraint` requires `tables` and
    # `constraint_id` (AbstractVars) and fills nothing itself; every constraint declares exactly
    # those two fields and overrides none of the base's concrete methods or properties.
    from functional_gen.structured import (
        AbstractConstraint,
        Choice,
        Grammar,
        JsonSchema,
        Regex,
        TokenConstraint,
    )

    assert dataclasses.fields(AbstractConstraint) == ()
    base = {
        name
        for name, value in vars(AbstractConstraint).items()
        if callable(value) or isinstance(value, property)
    } - {"__init__"}
    assert {"init", "process", "token_class", "pushdown"} <= base
    for cls in (Regex, JsonSchema, Choice, Grammar, TokenConstraint):
        assert {f.name for f in dataclasses.fields(cls)} == {"tables", "constraint_id"}, cls
        assert not base & set(vars(cls)), (cls, base & set(vars(cls)))
