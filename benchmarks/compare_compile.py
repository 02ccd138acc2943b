"""JSON Schema compile time of this checkout against another one, interleaved in ONE process.

On a shared machine two benchmark runs back to back see different loads; here each schema is
compiled by both checkouts one after the other (the order alternating), with every cache off
(`cache=False`, `regex_byte_dfa`'s memo cleared), so the ratio of the two is fair. The other
checkout's `functional_gen` is loaded under the package name `fg_other`. The two token automata
of each schema are compared after renumbering (classes by their smallest token id, states in
breadth-first order from the initial state): a speed-up must give the same automaton, up to
names.

Run: `python benchmarks/compare_compile.py /work/main --records results.json --max-ms 3000`
where `results.json` is a `bench_json_schema.py --json` output (the schemas it compiled in under
`--max-ms` are used; without `--records`, the `--limit 24` sample of the five splits).
Printed: p50 / p90 / p99 per checkout, the median per-schema ratio, and how many automata differ.
"""

import argparse
import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen first
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np


def canonical(automaton):
    """`(token_class, transitions, distance)` with classes renamed by their smallest token id
    and states numbered breadth-first from the initial state (dead state 0 kept)."""
    a = automaton
    first = np.full(a.num_classes, a.vocab_size)
    np.minimum.at(first, a.token_class, np.arange(a.vocab_size))
    class_order = np.argsort(first, kind="stable")
    class_rank = np.empty_like(class_order)
    class_rank[class_order] = np.arange(class_order.size)
    table = a.transitions[:, class_order]
    order, queue = {0: 0, 1: 1}, [1]
    for state in queue:
        for target in map(int, table[state]):
            if target not in order:
                order[target] = len(order)
                queue.append(target)
    lookup = np.zeros(a.num_states, np.int64)
    for old, new in order.items():
        lookup[old] = new
    rows = np.asarray([0, *queue])
    return class_rank[a.token_class], lookup[table[rows]], a.distance[rows]


def _percentile(values, q):
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout's root folder")
    parser.add_argument("--records", type=Path, help="a bench_json_schema.py --json output")
    parser.add_argument("--max-ms", type=float, default=3000.0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")

    import bench_json_schema as bench
    from transformers import AutoTokenizer

    import functional_gen.structured.byte_dfa as this_dfa
    import functional_gen.structured.json_schema as this_json
    from functional_gen.loading.default_model import converted_default_dir
    from functional_gen.structured import vocabulary_from_tokenizer

    root = args.other.resolve() / "functional_gen"
    spec = importlib.util.spec_from_file_location(
        "fg_other", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    other = importlib.util.module_from_spec(spec)
    sys.modules["fg_other"] = other
    spec.loader.exec_module(other)
    other_json = importlib.import_module("fg_other.structured.json_schema")
    other_dfa = importlib.import_module("fg_other.structured.byte_dfa")

    tokenizer = AutoTokenizer.from_pretrained(str(converted_default_dir()))
    sides = [
        (other_json, other_dfa, other.structured.vocabulary_from_tokenizer(tokenizer)),
        (this_json, this_dfa, vocabulary_from_tokenizer(tokenizer)),
    ]
    for json_module, _, _ in sides:  # `import jsonschema` once per process, not per schema
        json_module.check_schema({"type": "string"})
    records = bench.load_records(bench.DEFAULT_DATA, bench.FIVE_SPLITS, 24, 0)
    if args.records:
        times = {r["file"]: r.get("compile_ms") for r in json.loads(args.records.read_text())}
        records = [r for r in records if (times.get(r["file"]) or 1e18) < args.max_ms]
    print(f"{len(records)} schemas", file=sys.stderr)
    elapsed, differ = ([], []), 0
    for k, record in enumerate(records):
        built = [None, None]
        for side in (0, 1) if k % 2 == 0 else (1, 0):
            json_module, dfa_module, vocabulary = sides[side]
            dfa_module.regex_byte_dfa.cache_clear()
            start = time.perf_counter()
            built[side] = json_module.json_schema_automaton(
                record["schema"], vocabulary, cache=False
            )
            elapsed[side].append((time.perf_counter() - start) * 1000)
        pairs = zip(canonical(built[0]), canonical(built[1]))
        if not all(a.shape == b.shape and np.array_equal(a, b) for a, b in pairs):
            differ += 1
            print(f"different automata: {record['file']}", file=sys.stderr)
    for name, values in (("other", elapsed[0]), ("this", elapsed[1])):
        p50, p90, p99 = (_percentile(values, q) for q in (0.5, 0.9, 0.99))
        print(f"{name:5s} p50 {p50:7.1f}  p90 {p90:7.1f}  p99 {p99:8.1f} ms")
    ratios = [b / a for a, b in zip(*elapsed)]
    print(
        f"median per-schema ratio this/other {_percentile(ratios, 0.5):.2f}; "
        f"{differ} of {len(records)} automata differ beyond renaming"
    )


if __name__ == "__main__":
    main()
