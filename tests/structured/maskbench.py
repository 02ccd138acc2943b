"""MaskBench's rule on our automata: every valid document, tokenized as the tokenizer tokenizes
it, passes the mask at every step and then EOS (`tokens_pass`); the development data's records
(`dev_records`). Shared by `test_maskbench_dev.py` and `benchmarks/bench_json_schema.py`.

Source: guidance-ai/jsonschemabench, `maskbench/` (the data and the rule)."""

import gzip
import json
import random
from pathlib import Path

DEV_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "maskbench-dev.jsonl.gz"
"""`../shared/data/maskbench-dev.jsonl.gz` beside the checkout (absent on machines without it)."""


def refused_at(automaton, token_ids, eos_token_id: int) -> int | None:
    """The index of the first token of `token_ids` that the mask of its step refuses
    (`len(token_ids)`: EOS refused at the end), or `None` when every token and then EOS pass.
    The mask is the one the device computes (`allowed`: for a `PushdownAutomaton` the bitmask
    row plus the tokens walked exactly, stack included; no token budget), the step the
    automaton's own (`next_state`, or the pushdown walk of the token's bytes)."""
    pushdown = hasattr(automaton, "stack_depth")
    state = automaton.initial_config() if pushdown else 1  # with a register: 4 entries
    for i, t in enumerate(token_ids):
        if not automaton.allowed(state)[t]:
            return i
        if pushdown:
            data = bytes(automaton.token_bytes[t, : automaton.token_length[t]])
            state = automaton.walk(data, state)
            if state is None:  # `allowed` said yes: the tables and the walk disagree
                raise AssertionError(f"token {t} allowed but not walked")
        else:
            state = automaton.next_state(state, t)
    return None if automaton.allowed(state)[eos_token_id] else len(token_ids)


def tokens_pass(automaton, token_ids, eos_token_id: int) -> bool:
    """Whether every token of `token_ids`, then `eos_token_id`, passes (`refused_at`)."""
    return refused_at(automaton, token_ids, eos_token_id) is None


def dev_records(sample: int, seed: int = 0, max_schema_chars: int | None = None) -> list[dict]:
    """`sample` records of the development data drawn with `seed` (every split in proportion),
    optionally only schemas whose JSON text is at most `max_schema_chars` long."""
    with gzip.open(DEV_DATA, "rt") as f:
        records = [json.loads(line) for line in f]
    if max_schema_chars is not None:
        records = [r for r in records if len(json.dumps(r["schema"])) <= max_schema_chars]
    return random.Random(seed).sample(records, min(sample, len(records)))
