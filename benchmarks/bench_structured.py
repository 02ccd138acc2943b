"""Benchmark of structured generation, every comparison measured in one run (ratios, since the
machine is shared and absolute numbers drift between runs).

1. Decode step, constrained (a JSON Schema) vs unconstrained, on the default model
   (SmolLM2-135M-Instruct, float32), batch 1 and 8: 16 steps inside one jitted `fori_loop`,
   rounds interleaved, best round kept. Targets: <= 1.05x at batch 1, <= 1.15x at batch 8.
2. Compilation: our build + export of a token automaton vs outlines-core's bare `Index` build for
   the same regex (JSON Schemas converted first; the conversion is timed apart), and exporting
   outlines-core's token `Index` itself as the alternative. Target <= 1.5x.
   Also the cache (memory and disk: target < 50 ms) and the table sizes (target: a few MiB).
3. Grammars (no outlines-core counterpart): bounded-depth construction + our token lifting.
4. If `outlines` is installed (it needs no CUDA torch): outlines' transformers-based JSON
   generation vs ours on the same model, schema and prompt (greedy, batch 1), with plain
   transformers generation as the unconstrained reference.

Run: `python benchmarks/bench_structured.py` (about 3-5 minutes on 2 CPU cores).
"""

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import equinox as eqx
import jax

import functional_gen as fg
from functional_gen.structured import json_schema_regex, regex_automaton, vocabulary_from_tokenizer
from functional_gen.structured.automaton import clear_memory_cache, from_outlines_index
from functional_gen.structured.byte_dfa import build_regex_automaton
from functional_gen.structured.grammar import grammar_automaton

FIVE_FIELDS = {  # research/structured.md's "bounded" JSON schema
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
}
EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "format": "date"},
        "start": {"type": "string", "format": "time"},
        "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
    },
    "required": ["title", "date", "start", "attendees"],
}
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["sku", "quantity"],
            },
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["order_id", "items"],
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
REGEXES = {
    "ISO date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "email": r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}",
    "choice (3)": r"(?:banana|cherry|apple)",
}
SCHEMAS = {
    "JSON 5 fields (bounded)": FIVE_FIELDS,
    "event (formats)": EVENT,
    "order (nested)": ORDER,
}
JSON_GRAMMAR = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER | "true" | "false" | "null"
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""
ARITHMETIC = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")" | "-" factor
NUMBER: /[0-9]+(\.[0-9]+)?/
%import common.WS_INLINE
%ignore WS_INLINE
"""


def best(fn, repeat: int) -> float:
    """Smallest wall time of `repeat` calls, seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def table(headers, rows):
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


# --------------------------------------------------------------------------- 1. decode step


def step_timer(model, prompt, processors, batch: int, steps: int):
    """A function timing one decode step (seconds) of `batch` copies of `prompt` with
    `processors`: `steps` steps of a compiled `fori_loop` over `make_step`, divided by `steps`
    (compiled here, before the first timing)."""
    step = fg.make_step(model, processors)
    state = fg.init_state(model, [prompt] * batch, max_new_tokens=steps + 1, processors=processors)

    @eqx.filter_jit
    def run(step, state):
        return jax.lax.fori_loop(0, steps, lambda i, s: step(s), state)

    jax.block_until_ready(run(step, state).token_ids)  # compile

    def once():
        start = time.perf_counter()
        jax.block_until_ready(run(step, state).token_ids)
        return (time.perf_counter() - start) / steps

    return once


def decode_step(model, tokenizer, rounds: int, steps: int = 16):
    constraint = fg.processors.JsonSchema(FIVE_FIELDS, tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give a user record as JSON."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )

    def runner(processors, batch):
        return step_timer(model, prompt, processors, batch, steps)

    rows = []
    for batch, target in ((1, 1.05), (8, 1.15)):
        runs = {"none": runner([], batch), "json": runner([constraint], batch)}
        samples = {k: [] for k in runs}
        for _ in range(rounds):
            for k, f in runs.items():
                samples[k].append(f())
        plain, constrained = min(samples["none"]), min(samples["json"])
        ratio = constrained / plain
        rows.append(
            [
                batch,
                f"{plain * 1e3:.1f}",
                f"{constrained * 1e3:.1f}",
                f"{ratio:.3f}",
                f"<= {target}",
                "yes" if ratio <= target else "NO",
                f"{statistics.median(samples['json']) / statistics.median(samples['none']):.3f}",
            ]
        )
    print("## 1. Decode step (ms per step; JSON Schema with 5 fields vs no processor)\n")
    table(
        [
            "batch",
            "unconstrained",
            "constrained",
            "ratio (best)",
            "target",
            "met",
            "ratio (median)",
        ],
        rows,
    )


# --------------------------------------------------------------------------- 2. compilation


def compilation(vocabulary, repeat: int):
    from outlines_core import Index

    rows, sizes = [], []
    cases = [(name, rx, None) for name, rx in REGEXES.items()]
    for name, schema in SCHEMAS.items():
        start = time.perf_counter()
        rx = json_schema_regex(schema)
        cases.append((name, rx, time.perf_counter() - start))
    for name, rx, convert in cases:
        bare = best(lambda rx=rx: Index(rx, vocabulary.outlines_vocabulary), repeat)
        ours = best(lambda rx=rx: build_regex_automaton(rx, vocabulary), repeat)
        exported = best(
            lambda rx=rx: from_outlines_index(
                Index(rx, vocabulary.outlines_vocabulary), vocabulary
            ),
            repeat,
        )
        a = build_regex_automaton(rx, vocabulary)
        ratio = ours / bare
        rows.append(
            [
                name,
                f"{bare * 1e3:.0f}",
                f"{ours * 1e3:.0f}",
                f"{ratio:.2f}",
                "yes" if ratio <= 1.5 else "NO",
                f"{exported * 1e3:.0f} ({exported / bare:.2f}x)",
                "-" if convert is None else f"{convert * 1e3:.1f}",
            ]
        )
        sizes.append(
            [
                name,
                a.num_states,
                a.num_classes,
                f"{a.nbytes / 2**20:.2f}",
                f"{a.num_states * vocabulary.vocab_size * 4 / 2**20:.1f}",
            ]
        )
    print(f"## 2. Compilation (ms, best of {repeat}): outlines-core's bare `Index` vs our build\n")
    print("Ours: regex -> byte DFA (outlines-core, 256 one-byte tokens) -> minimise -> lift to the")
    print("vocabulary -> device tables. Target <= 1.5x the bare `Index`. Last but one column: the")
    print(
        "alternative of exporting outlines-core's token `Index` itself (`get_transitions` + fromiter).\n"
    )
    table(
        [
            "constraint",
            "bare Index",
            "ours, build + export",
            "ratio",
            "<= 1.5x",
            "Index + export",
            "schema -> regex",
        ],
        rows,
    )
    print("Device tables per constraint (MiB) vs a dense int32 [states, vocab] table:\n")
    table(["constraint", "states", "classes", "tables MiB", "dense MiB"], sizes)

    # Cache: memory hit, then a disk hit in a fresh memory cache.
    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("FUNCTIONAL_GEN_CACHE")
        os.environ["FUNCTIONAL_GEN_CACHE"] = cache
        try:
            rx = json_schema_regex(FIVE_FIELDS)
            clear_memory_cache()
            first = best(lambda: regex_automaton(rx, vocabulary), 1)
            memory = best(lambda: regex_automaton(rx, vocabulary), 5)
            disk = []
            for _ in range(5):
                clear_memory_cache()
                disk.append(best(lambda: regex_automaton(rx, vocabulary), 1))
            processor = best(lambda: fg.processors.JsonSchema(FIVE_FIELDS, tokenizer_for_cache), 3)
        finally:
            if old is None:
                del os.environ["FUNCTIONAL_GEN_CACHE"]
            else:
                os.environ["FUNCTIONAL_GEN_CACHE"] = old
            clear_memory_cache()
    print("Cache (JSON 5 fields), target < 50 ms for a second build:\n")
    table(
        [
            "first build",
            "memory hit",
            "disk hit",
            "JsonSchema(...) again (schema check + regex + hit)",
        ],
        [
            [
                f"{first * 1e3:.0f} ms",
                f"{memory * 1e3:.2f} ms",
                f"{min(disk) * 1e3:.1f} ms",
                f"{processor * 1e3:.1f} ms",
            ]
        ],
    )


# --------------------------------------------------------------------------- 3. grammars


def grammars(vocabulary):
    rows = []
    for name, grammar, depths in (
        ("JSON", JSON_GRAMMAR, (2, 3, 4, 5)),
        ("arithmetic", ARITHMETIC, (2, 4, 8)),
    ):
        for depth in depths:
            start = time.perf_counter()
            a = grammar_automaton(grammar, vocabulary, max_depth=depth, cache=False)
            rows.append(
                [
                    name,
                    depth,
                    f"{(time.perf_counter() - start) * 1e3:.0f}",
                    a.num_states,
                    a.num_classes,
                    f"{a.nbytes / 2**20:.2f}",
                ]
            )
    print("## 3. Grammars: bounded-depth construction + token lifting\n")
    table(["grammar", "max_depth", "build ms", "states", "classes", "MiB"], rows)


# --------------------------------------------------------------------------- 4. outlines


def versus_outlines(model, tokenizer, max_new_tokens: int):
    if importlib.util.find_spec("outlines") is None:
        print("## 4. outlines (transformers) vs ours: skipped, `outlines` is not installed\n")
        return
    import outlines
    import torch
    from outlines.types import JsonSchema as OutlinesJsonSchema
    from transformers import AutoModelForCausalLM

    from functional_gen.loading import ensure_default_checkpoint

    torch.set_num_threads(2)
    checkpoint = str(ensure_default_checkpoint())
    hf_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Give a person as JSON."}]
    prompt_text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )

    def count(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1  # + EOS

    generator = outlines.Generator(
        outlines.from_transformers(hf_model, tokenizer), OutlinesJsonSchema(json.dumps(PERSON))
    )
    start = time.perf_counter()
    generator(prompt_text, max_new_tokens=max_new_tokens, do_sample=False)
    outlines_first = time.perf_counter() - start
    outlines_text = generator(prompt_text, max_new_tokens=max_new_tokens, do_sample=False)
    outlines_time = best(
        lambda: generator(prompt_text, max_new_tokens=max_new_tokens, do_sample=False), 2
    )

    ours_processor = fg.processors.JsonSchema(PERSON, tokenizer)
    result = fg.generate(
        model, tokenizer, [messages], max_new_tokens=max_new_tokens, processors=[ours_processor]
    )
    ours_time = best(
        lambda: fg.generate(
            model, tokenizer, [messages], max_new_tokens=max_new_tokens, processors=[ours_processor]
        ),
        2,
    )
    plain_ids = tokenizer(prompt_text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        hf_time = best(
            lambda: hf_model.generate(
                **plain_ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                min_new_tokens=max_new_tokens,
            ),
            1,
        )
    ours_tokens = result.num_tokens[0]
    rows = [
        [
            "outlines 1.x + transformers (JSON)",
            count(outlines_text),
            f"{outlines_time:.2f}",
            f"{count(outlines_text) / outlines_time:.1f}",
            f"first call {outlines_first:.1f} s",
            repr(outlines_text),
        ],
        [
            "functional_gen (JSON, on device)",
            ours_tokens,
            f"{ours_time:.2f}",
            f"{ours_tokens / ours_time:.1f}",
            "",
            repr(result.texts[0]),
        ],
        [
            "transformers, unconstrained",
            max_new_tokens,
            f"{hf_time:.2f}",
            f"{max_new_tokens / hf_time:.1f}",
            "",
            "",
        ],
    ]
    print("## 4. JSON generation end to end (greedy, batch 1, PERSON schema, prompt included)\n")
    table(["system", "tokens", "seconds", "tokens/s", "note", "output"], rows)


tokenizer_for_cache = None


def main():
    global tokenizer_for_cache
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of the decode-step timing"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions of each compilation timing"
    )
    parser.add_argument("--skip-outlines", action="store_true")
    args = parser.parse_args()

    model, tokenizer = fg.load_model()
    tokenizer_for_cache = tokenizer
    vocabulary = vocabulary_from_tokenizer(tokenizer)
    print(
        f"# Structured generation benchmark ({jax.devices()[0].platform}, {os.cpu_count()} CPUs)\n"
    )
    decode_step(model, tokenizer, args.rounds)
    compilation(vocabulary, args.repeat)
    grammars(vocabulary)
    if not args.skip_outlines:
        versus_outlines(model, tokenizer, max_new_tokens=48)


if __name__ == "__main__":
    main()
