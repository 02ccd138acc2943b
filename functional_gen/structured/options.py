"""`constraint_from_options`: the structured-generation processor for command-line values."""

import json
import os
from collections.abc import Sequence
from pathlib import Path

from .choice import Choice
from .grammar import Grammar
from .json_schema import JsonSchema
from .processor import AbstractConstraint
from .regex import Regex


def _json_schema_value(value: str):
    """A JSON Schema given on the command line: a path to a file, or JSON text."""
    text = value.strip()
    if text.startswith(("{", "[")) or text in ("true", "false"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"--json-schema: not valid JSON ({e}); pass JSON text or a file path"
            ) from None
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        raise ValueError(f"--json-schema: {value!r} is neither JSON text nor an existing file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--json-schema: the file {path} is not valid JSON ({e})") from None


def constraint_from_options(
    tokenizer,
    *,
    regex: str | None = None,
    json_schema: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | os.PathLike | None = None,
    gbnf: str | None = None,
    max_depth: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> AbstractConstraint | None:
    """The processor for the CLI flags `--regex`, `--json-schema`, `--choice`, `--grammar`,
    `--lark-grammar`.

    **Arguments:**

    - `tokenizer`: the model's tokenizer.
    - `regex`: `--regex PATTERN`, the whole output must match it.
    - `json_schema`: `--json-schema FILE_OR_JSON`, a path to a JSON Schema file or the schema as
      JSON text.
    - `choice`: `--choice A B C`, the output is exactly one of them.
    - `grammar`: `--lark-grammar FILE`, a Lark grammar file.
    - `gbnf`: `--grammar GBNF_OR_FILE`, a GBNF grammar (llama.cpp's format): its text, or a path
      to a file.
    - `max_depth`: nesting bound for `grammar` (forces the bounded-depth DFA; default: automatic,
      see `Grammar`).
    - `eos_token_id`: the model's end-of-generation ids (default: the tokenizer's, see `Regex`).

    **Returns:** the processor (`Regex`, `JsonSchema`, `Choice` or `Grammar`), or `None` when no
    option is given.

    **Raises:** `ValueError` when more than one option is given, for an unreadable schema or
    grammar file, or from the processor (invalid regex, unsupported schema keyword, grammar
    error), always before any compilation of the generation loop.
    """
    given = {
        name: value
        for name, value in (
            ("--regex", regex),
            ("--json-schema", json_schema),
            ("--choice", choice),
            ("--lark-grammar", grammar),
            ("--grammar", gbnf),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ValueError(
            f"give at most one of --regex, --json-schema, --choice, --grammar, --lark-grammar; got {sorted(given)}"
        )
    kwargs = {"eos_token_id": eos_token_id}
    if regex is not None:
        return Regex(regex, tokenizer, **kwargs)
    if json_schema is not None:
        return JsonSchema(_json_schema_value(json_schema), tokenizer, **kwargs)
    if choice is not None:
        return Choice(list(choice), tokenizer, **kwargs)
    if grammar is not None:
        path = Path(os.path.expanduser(os.fspath(grammar)))
        if not path.is_file():
            raise ValueError(f"--lark-grammar: {os.fspath(grammar)!r} is not an existing file")
        return Grammar(path, tokenizer, max_depth=max_depth, **kwargs)
    if gbnf is not None:
        path = Path(os.path.expanduser(gbnf)) if "::=" not in gbnf else None
        if path is not None and not path.is_file():
            raise ValueError(
                f"--grammar: {gbnf!r} is neither GBNF text (rules `name ::= ...`) nor an existing file"
            )
        return Grammar.from_gbnf(
            path if path is not None else gbnf, tokenizer, max_depth=max_depth, **kwargs
        )
    return None
