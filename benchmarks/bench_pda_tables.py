"""Benchmark of the pushdown automaton's token tables (`functional_gen.structured.pushdown.
building.token_tables`): the shared walk against the per-origin walk it replaced (`_token_tables_old`:
`pda.py` at git revision `BASELINE`, 98cf923, imported from a `git archive` copy of the package
at that revision by `compare_pushdown.baseline_pda`), interleaved in one process on the same inputs, tables
checked identical.

Inputs: the Lark JSON grammar at stack depth 32 (as `bench_pushdown.py` builds it) and the
grammar forms of MaskBench schemas from `/work/shared/data/maskbench-dev.jsonl.gz` (Github_hard
o32921, o41296, o21316, o21251; Kubernetes kb_972, kb_594), compiled with
`json_schema.MAX_GRAMMAR_POSITIONS` lifted so that every one builds. For each: the whole
compile once (`json_schema_compile`, new tables), then `--rounds` rounds of old and new tables
alternated; the best of each is reported, with their ratio.

With `--free-form`, also the compile time of `json_schema_compile(schema,
free_form_depth=None)` (free-form values as the pushdown `value` rule) on Github_easy o13687,
o21865, Github_hard o12281 and Kubernetes kb_688, kb_972: new tables vs `_token_tables_old`
patched in, interleaved.

Recorded on 2026-11-23 on the shared 2-core machine, `--rounds 2 --free-form` at 02:24 UTC (load
average 1.7-2.5, other jobs running; best of 2 each; tables identical in every round):

| input | positions | compile s (new tables) | tables new s | tables old s | old / new |
|---|---|---|---|---|---|
| Lark JSON, depth 32 | 47 | 0.65 | 0.09 | 0.08 | 0.85 |
| Github_hard o21251 | 6,148 | 6.99 | 1.82 | 10.83 | 5.94 |
| Github_hard o21316 | 8,219 | 7.04 | 2.19 | 11.03 | 5.03 |
| Github_hard o32921 | 1,081 | 1.16 | 0.48 | 1.45 | 3.02 |
| Github_hard o41296 | 1,947 | 1.59 | 0.56 | 1.72 | 3.07 |
| Kubernetes kb_594 | 2,392 | 2.82 | 0.98 | 11.08 | 11.25 |
| Kubernetes kb_972 | 2,051 | 2.68 | 0.88 | 7.10 | 8.09 |

Whole compile with `free_form_depth=None`, new / old tables (s): o13687 0.17 / 0.17, o21865
0.27 / 0.62, o12281 0.83 / 2.25, kb_688 0.36 / 0.74, kb_972 1.86 / 11.75.
What is left: per walker, the walk costs about 100 ns of numpy work (the trie's children, the
successor table, one argsort per depth to deduplicate); positions are still walked once more
per slot below the first bytes from which a token returns; the tiny Lark grammar pays a fixed
cost per depth (81 depths) that the old walk paid too.

Run: `python benchmarks/bench_pda_tables.py [--rounds 2] [--free-form] [--schemas ...]` (about 5
minutes; `--schemas` with no names times the Lark grammar alone).
"""

import argparse
import gc
import gzip
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from functional_gen.structured import json_schema as json_schema_module
from functional_gen.structured.pushdown import building as pda_module

DATA = "/work/shared/data/maskbench-dev.jsonl.gz"
SCHEMAS = (
    "Github_hard---o32921.json",
    "Github_hard---o41296.json",
    "Github_hard---o21316.json",
    "Github_hard---o21251.json",
    "Kubernetes---kb_972_Normalized.json",
    "Kubernetes---kb_594_Normalized.json",
)
FREE_FORM = (
    "Github_easy---o13687.json",
    "Github_easy---o21865.json",
    "Github_hard---o12281.json",
    "Kubernetes---kb_688_Normalized.json",
    "Kubernetes---kb_972_Normalized.json",
)


BASELINE = "98cf923"
"""The commit whose `pda._token_tables` (the per-origin walk, before the shared walk) is the
baseline: read from git at run time, not copied here."""


def _baseline_token_tables(rev: str = BASELINE):
    """`pda._token_tables` as it was at git revision `rev` of this checkout
    (`compare_pushdown.baseline_pda`: the module at that revision, in the package at that
    revision, imported under its own name).

    **Raises:** `subprocess.CalledProcessError` when `rev` is not in this checkout's history."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare_pushdown import baseline_pda

    return baseline_pda(rev)._token_tables


def _vocabulary():
    from transformers import AutoTokenizer

    from functional_gen.loading.default_model import (
        converted_default_dir,
        ensure_default_checkpoint,
    )
    from functional_gen.structured import vocabulary_from_tokenizer

    ensure_default_checkpoint()
    return vocabulary_from_tokenizer(AutoTokenizer.from_pretrained(str(converted_default_dir())))


def _schemas(names):
    found = {}
    with gzip.open(DATA, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record["file"] in names:
                found[record["file"]] = record["schema"]
    return found


def _equal(new, old):
    for a, b in zip(new, old, strict=True):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        else:
            assert a == b


def _timed(fn, *args, **kwargs):
    gc.collect()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def _capture(build):
    """Run `build()` with the new tables; returns `(total seconds, table seconds, table args)`,
    the last two `None` when it built no pushdown tables."""
    real, seen = pda_module.token_tables, {}

    def spy(*args):
        seen["args"] = args
        out, seen["seconds"] = _timed(real, *args)
        return out

    pda_module.token_tables = spy
    try:
        _, total = _timed(build)
    finally:
        pda_module.token_tables = real
    return total, seen.get("seconds"), seen.get("args")


def tables(vocabulary, rounds: int, schemas=SCHEMAS):
    from functional_gen.structured import pushdown_automaton
    from tests.structured.cases import PUSHDOWN_GRAMMARS

    json_schema_module.budgets.MAX_GRAMMAR_POSITIONS = 10**9
    cases = [
        (
            "Lark JSON, depth 32",
            lambda: pushdown_automaton(
                PUSHDOWN_GRAMMARS["json"], vocabulary, stack_depth=32, cache=False
            ),
        )
    ]
    for name, schema in _schemas(schemas).items():
        cases.append(
            (
                name,
                lambda s=schema: json_schema_module.json_schema_compile(s, vocabulary, cache=False),
            )
        )
    print(
        "| input | positions | compile s (new tables) | tables new s | tables old s | old / new |"
    )
    print("|---|---|---|---|---|---|")
    for name, build in cases:
        total, _, args = _capture(build)
        if args is None:  # compiled without pushdown tables (a token automaton)
            print(f"| {name} | - | {total:.2f} | no pushdown tables | - | - |", flush=True)
            continue
        new_times, old_times = [], []
        for _ in range(rounds):
            old, seconds = _timed(_token_tables_old, *args)
            old_times.append(seconds)
            new, seconds = _timed(pda_module.token_tables, *args)
            new_times.append(seconds)
            _equal(new, old)
        print(
            f"| {name} | {args[0].shape[0]:,} | {total:.2f} | {min(new_times):.2f} | "
            f"{min(old_times):.2f} | {min(old_times) / min(new_times):.2f} |",
            flush=True,
        )


def free_form(vocabulary, rounds: int):
    json_schema_module.budgets.MAX_GRAMMAR_POSITIONS = 10**9
    real = pda_module.token_tables
    print("\n| schema (free_form_depth=None) | compile s new | compile s old | old / new |")
    print("|---|---|---|---|")
    for name, schema in _schemas(FREE_FORM).items():
        times = {"new": [], "old": []}
        for _ in range(rounds):
            for label, fn in (("old", _token_tables_old), ("new", real)):
                pda_module.token_tables = fn
                json_schema_module.pushdown_form.PUSHDOWN_CACHE.clear()  # kept even with cache=False
                try:
                    _, seconds = _timed(
                        json_schema_module.json_schema_compile,
                        schema,
                        vocabulary,
                        cache=False,
                        free_form_depth=None,
                    )
                except Exception as error:
                    seconds = float("nan")
                    print(f"{name} {label}: {type(error).__name__}: {error}"[:200])
                finally:
                    pda_module.token_tables = real
                times[label].append(seconds)
        new, old = min(times["new"]), min(times["old"])
        print(f"| {name} | {new:.2f} | {old:.2f} | {old / new:.2f} |", flush=True)


def main():
    global _token_tables_old
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--free-form", action="store_true")
    parser.add_argument(
        "--schemas", nargs="*", default=list(SCHEMAS), help="MaskBench file names (none: Lark only)"
    )
    options = parser.parse_args()
    _token_tables_old = _baseline_token_tables()
    vocabulary = _vocabulary()
    tables(vocabulary, options.rounds, options.schemas)
    if options.free_form:
        free_form(vocabulary, options.rounds)


if __name__ == "__main__":
    main()
