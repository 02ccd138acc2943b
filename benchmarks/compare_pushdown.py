"""Compile time of JSON Schemas as pushdown automata (`json_schema_compile(schema,
free_form_depth=None, cache=False)`): this checkout's `functional_gen/structured/pushdown/`
(before issue 39's split: `pda.py`) against `pda.py` at a git revision (`--rev`, default `main`), interleaved in one process
on the same inputs (the shared machine's load drifts: compare ratios, not absolute times), and
every table of the two automata checked identical (`PushdownAutomaton` fields, dtype, shape
and values). The baseline's `build_pushdown` is patched into `json_schema`'s grammar and pushdown forms for its turns; all
other modules are this checkout's.

Inputs: a small schema with one free-form value (`SMALL`: 126 positions) and the MaskBench
schemas that need free-form nesting deeper than one level, or are large open objects
(`/work/shared/data/maskbench-dev.jsonl.gz`; `--files` to choose). Printed per schema:
positions, best of `--rounds` for each side, new / old, identical.

Recorded on 2026-11-23 at 04:50 UTC (branch pdafast at f6c53ed against main ca08732,
`--rounds 3`, the shared 2-core machine at load average 4: absolute times inflated, ratios
hold; identical tables on every schema). An earlier run at load 1-2 gave the same ratios
(0.61-0.72) at about 2/3 of these times (SMALL: 162 -> 112 ms).

| schema | positions | main ms | pdafast ms | pdafast / main |
|---|---|---|---|---|
| SMALL | 126 | 241 | 165 | 0.68 |
| Github_easy o13687 | 132 | 236 | 164 | 0.69 |
| Github_easy o21865 | 261 | 388 | 265 | 0.68 |
| Github_easy o65951 | 796 | 1,748 | 1,343 | 0.77 |
| Kubernetes kb_688 | 437 | 557 | 345 | 0.62 |

Run: `python benchmarks/compare_pushdown.py [--rev main] [--rounds 3] [--files ...]`.
"""

import argparse
import dataclasses
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from functional_gen.structured import json_schema as json_schema_module, pushdown as pda_module

DATA = "/work/shared/data/maskbench-dev.jsonl.gz"
SMALL = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
    "required": ["name"],
}
FILES = (
    "Github_easy---o13687.json",
    "Github_easy---o21865.json",
    "Kubernetes---kb_688_Normalized.json",
    "Github_easy---o65951.json",
)


def baseline_pda(rev: str):
    """`functional_gen/structured/pda.py` at git revision `rev` of this checkout, loaded as a
    module of the current package (its relative imports resolve to the current modules).

    **Raises:** `subprocess.CalledProcessError` when `rev` is not in this checkout's history."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    source = subprocess.run(
        ["git", "show", f"{rev}:functional_gen/structured/pda.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = "functional_gen.structured._pda_compare"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__package__ = "functional_gen.structured"
    sys.modules[name] = module  # dataclasses look their module up while the source runs
    exec(compile(source, f"{rev}:functional_gen/structured/pda.py", "exec"), module.__dict__)
    return module


def identical(a, b) -> bool:
    """Whether two `PushdownAutomaton`s have the same fields (arrays: dtype, shape, values)."""
    for field in dataclasses.fields(pda_module.PushdownAutomaton):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _vocabulary():
    from transformers import AutoTokenizer

    from functional_gen.loading.default_model import (
        converted_default_dir,
        ensure_default_checkpoint,
    )
    from functional_gen.structured import vocabulary_from_tokenizer

    ensure_default_checkpoint()
    return vocabulary_from_tokenizer(AutoTokenizer.from_pretrained(str(converted_default_dir())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="main", help="git revision of the baseline pda.py")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--files", nargs="*", default=list(FILES), help="MaskBench file names")
    args = parser.parse_args()
    vocabulary = _vocabulary()
    sides = {"old": baseline_pda(args.rev), "new": pda_module}
    schemas = {"SMALL": SMALL}
    with gzip.open(DATA, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record["file"] in args.files:
                schemas[record["file"]] = record["schema"]
    print("| schema | positions | old ms | new ms | new / old | identical |")
    print("|---|---|---|---|---|---|")
    try:
        for name, schema in schemas.items():
            best, built = {"old": np.inf, "new": np.inf}, {}
            for _ in range(args.rounds):
                for side, module in sides.items():
                    json_schema_module.grammar_form.build_pushdown = module.build_pushdown
                    json_schema_module.pushdown_form.build_pushdown = module.build_pushdown
                    start = time.perf_counter()
                    built[side] = json_schema_module.json_schema_compile(
                        schema, vocabulary, cache=False, free_form_depth=None
                    )
                    best[side] = min(best[side], time.perf_counter() - start)
            print(
                f"| {name} | {built['new'].num_positions} | {best['old'] * 1e3:.0f} | "
                f"{best['new'] * 1e3:.0f} | {best['new'] / best['old']:.2f} | "
                f"{identical(built['old'], built['new'])} |",
                flush=True,
            )
    finally:
        json_schema_module.grammar_form.build_pushdown = pda_module.build_pushdown
        json_schema_module.pushdown_form.build_pushdown = pda_module.build_pushdown


if __name__ == "__main__":
    main()
