"""Compile time of JSON Schemas as pushdown automata (`json_schema_compile(schema,
free_form_depth=None, cache=False)`): this checkout's `functional_gen/structured/pushdown/`
(before issue 39's split: `pda.py`) against the same at a git revision (`--rev`, default
`main`; the whole package at that revision is imported under its own name, see
`baseline_package`), interleaved in one process on the same inputs (the shared machine's load
drifts: compare ratios, not absolute times), and every table of the two automata checked identical (`PushdownAutomaton` fields, dtype, shape
and values). Each side compiles with its own package (JSON Schema rewriting included), so the
times are of the whole compile at each revision.

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
import atexit
import dataclasses
import gzip
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

import functional_gen
from functional_gen.structured import pushdown as pda_module

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


def baseline_package(rev: str):
    """The `functional_gen` package at git revision `rev` of this checkout, imported under its own
    name (`functional_gen_at_<rev>`) from a temporary copy (`git archive`), so that its modules
    import each other as they were at `rev` (modules later moved or renamed included).

    **Raises:** `subprocess.CalledProcessError` when `rev` is not in this checkout's history."""
    name = "functional_gen_at_" + re.sub(r"\W", "_", rev)
    if name in sys.modules:
        return sys.modules[name]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    archive = subprocess.run(
        ["git", "archive", rev, "functional_gen"], cwd=root, capture_output=True, check=True
    ).stdout
    folder = tempfile.mkdtemp(prefix="fg-baseline-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    os.rename(os.path.join(folder, "functional_gen"), os.path.join(folder, name))
    sys.path.insert(0, folder)
    return importlib.import_module(name)


def baseline_pda(rev: str):
    """The pushdown module at git revision `rev`: `structured/pda.py` before issue 39's split,
    `structured/pushdown/building.py` after it (see `baseline_package`).

    **Raises:** `subprocess.CalledProcessError` when `rev` is not in this checkout's history."""
    package = baseline_package(rev).__name__
    try:
        return importlib.import_module(f"{package}.structured.pda")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package}.structured.pushdown.building")


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


def _tokenizer():
    from transformers import AutoTokenizer

    from functional_gen.loading.default_model import (
        converted_default_dir,
        ensure_default_checkpoint,
    )

    ensure_default_checkpoint()
    return AutoTokenizer.from_pretrained(str(converted_default_dir()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rev", default="main", help="git revision of the baseline pushdown module"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--files", nargs="*", default=list(FILES), help="MaskBench file names")
    args = parser.parse_args()
    tokenizer = _tokenizer()
    # each side compiles with its own package: modules of two revisions do not mix
    packages = {"old": baseline_package(args.rev).__name__, "new": functional_gen.__name__}
    structured = {s: importlib.import_module(f"{p}.structured") for s, p in packages.items()}
    compile_ = {
        s: importlib.import_module(f"{p}.structured.json_schema").json_schema_compile
        for s, p in packages.items()
    }
    vocabularies = {s: m.vocabulary_from_tokenizer(tokenizer) for s, m in structured.items()}
    schemas = {"SMALL": SMALL}
    with gzip.open(DATA, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record["file"] in args.files:
                schemas[record["file"]] = record["schema"]
    print("| schema | positions | old ms | new ms | new / old | identical |")
    print("|---|---|---|---|---|---|")
    for name, schema in schemas.items():
        best, built = {"old": np.inf, "new": np.inf}, {}
        for _ in range(args.rounds):
            for side in packages:
                start = time.perf_counter()
                built[side] = compile_[side](
                    schema, vocabularies[side], cache=False, free_form_depth=None
                )
                best[side] = min(best[side], time.perf_counter() - start)
        print(
            f"| {name} | {built['new'].num_positions} | {best['old'] * 1e3:.0f} | "
            f"{best['new'] * 1e3:.0f} | {best['new'] / best['old']:.2f} | "
            f"{identical(built['old'], built['new'])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
