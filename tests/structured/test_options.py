"""`constraint_from_options`: the processors behind --regex, --json-schema, --choice, --grammar."""

import json

import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import UnsupportedSchemaError, constraint_from_options

from .cases import ARITHMETIC


def test_each_option_gives_its_processor(tokenizer, tmp_path):
    assert constraint_from_options(tokenizer) is None
    assert isinstance(constraint_from_options(tokenizer, regex="[0-9]+"), fg.processors.Regex)
    assert isinstance(constraint_from_options(tokenizer, choice=["a", "b"]), fg.processors.Choice)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    from_text = constraint_from_options(tokenizer, json_schema=json.dumps(schema))
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    from_file = constraint_from_options(tokenizer, json_schema=str(path))
    assert isinstance(from_file, fg.processors.JsonSchema)
    np.testing.assert_array_equal(
        np.asarray(from_text.transitions), np.asarray(from_file.transitions)
    )
    grammar = tmp_path / "calc.lark"
    grammar.write_text(ARITHMETIC)
    assert isinstance(
        constraint_from_options(tokenizer, grammar=str(grammar), max_depth=2), fg.processors.Grammar
    )
    # --grammar takes GBNF (llama.cpp's format), as text or as a file
    gbnf = 'root ::= "(" [a-z]+ ("," [a-z]+)* ")"'
    from_gbnf = constraint_from_options(tokenizer, gbnf=gbnf)
    path = tmp_path / "list.gbnf"
    path.write_text(gbnf)
    from_gbnf_file = constraint_from_options(tokenizer, gbnf=str(path))
    assert (
        isinstance(from_gbnf, fg.processors.Grammar) and from_gbnf.pushdown is None
    )  # not recursive: a DFA
    np.testing.assert_array_equal(
        np.asarray(from_gbnf.transitions), np.asarray(from_gbnf_file.transitions)
    )


def test_option_errors(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="at most one"):
        constraint_from_options(tokenizer, regex="a", choice=["b"])
    with pytest.raises(ValueError, match="neither JSON text nor an existing file"):
        constraint_from_options(tokenizer, json_schema="no-such-file.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        constraint_from_options(tokenizer, json_schema="{oops")
    with pytest.raises(ValueError, match="not an existing file"):
        constraint_from_options(tokenizer, grammar=str(tmp_path / "missing.lark"))
    with pytest.raises(ValueError, match="neither GBNF text"):
        constraint_from_options(tokenizer, gbnf=str(tmp_path / "missing.gbnf"))
    with pytest.raises(UnsupportedSchemaError, match="`not`"):
        constraint_from_options(tokenizer, json_schema='{"not": {"pattern": "a"}}')
