"""llama.cpp's side of `bench_generate.py`, importable without JAX or functional_gen, so that it
can run in another Python that has `llama-cpp-python` (e.g. a separate virtualenv where it was
compiled) while the benchmark itself runs in the project's:

    other-venv/bin/python benchmarks/llama_cpp_runner.py < spec.json > results.json

`spec.json`: `{"systems": {name: [gguf path, outtype or null]}, "folder": path, "prompt": [ids],
"long_prompts": [[ids], ...], "batches": [1, 8], "new_tokens": N, "repeats": R}` (an `outtype`
runs the file requantized to it by `requantized_gguf`, made once in `folder`). The answer (one JSON line on stdout):
per system its weight bytes, parameters, first-call time, the greedy tokens of 32 steps, the
median decode times `times["B,count"]` and prefill times `prefill["length"]`, measured as
`bench_generate.py` measures them (its docstring), the systems alternating.

`requantized_gguf` makes a GGUF of another tensor type (f32, bf16, q8_0) from an existing one
with llama.cpp's own `llama_model_quantize` (`allow_requantize`): from a Q4_K_M file its f32
version holds exactly the dequantized weights that functional_gen and transformers load.
"""

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

THREADS = 2
FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}


@contextlib.contextmanager
def quiet_stderr():
    """llama.cpp logs hundreds of lines to fd 2 (a Python log callback segfaulted, see the
    environment notes §4): discard them while it loads."""
    with open(os.devnull, "w") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def requantized_gguf(source: Path, outtype: str, folder: Path) -> Path:
    """`source` (a GGUF) as a GGUF of `outtype` (`f32`, `bf16` or `q8_0`) in `folder`, made
    once with `llama_model_quantize` (requantizing: every tensor dequantized first).

    **Raises:** `ValueError` for another `outtype`; `RuntimeError` when llama.cpp fails."""
    import llama_cpp as L

    if outtype not in FTYPES:
        raise ValueError(f"outtype {outtype!r}: expected one of {sorted(FTYPES)}")
    target = folder / f"{Path(source).stem}-{outtype}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, FTYPES[outtype])
    params.allow_requantize = True
    params.nthread = THREADS
    tmp = target.with_suffix(".tmp")
    print(f"requantizing {Path(source).name} to {outtype} with llama.cpp...", file=sys.stderr)
    with quiet_stderr():
        L.llama_backend_init()
        code = L.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
    if code != 0:
        raise RuntimeError(f"llama_model_quantize({source}, {outtype}) returned {code}")
    tmp.rename(target)
    return target


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API (batched decoding of B sequences)."""

    def __init__(self, name: str, path: Path):
        import llama_cpp as L

        self.L = L
        self.name = name
        with quiet_stderr():
            L.llama_backend_init()
            self.model = L.llama_model_load_from_file(
                str(path).encode(), L.llama_model_default_params()
            )
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.parameters = L.llama_model_n_params(self.model)
        self.weight_bytes = L.llama_model_size(self.model)
        self.contexts = {}

    def _context(self, rows: int, tokens: int = 1024):
        L = self.L
        key = (rows, tokens)
        if key not in self.contexts:
            p = L.llama_context_default_params()
            p.n_ctx = max(1024, tokens + 1) * rows
            p.n_batch = p.n_ubatch = 512
            p.n_seq_max = rows
            p.n_threads = p.n_threads_batch = THREADS
            with quiet_stderr():
                ctx = L.llama_init_from_model(self.model, p)
            self.contexts[key] = (ctx, L.llama_batch_init(512, 0, rows))
        ctx, batch = self.contexts[key]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        return ctx, batch

    def _decode(self, ctx, batch, entries):
        """entries: (token, position, sequence, wants logits), at most 512 -> logits of the
        flagged ones."""
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        if self.L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        flagged = sum(1 for e in entries if e[3])
        out = self.L.llama_get_logits(ctx)
        return np.ctypeslib.as_array(out, shape=(flagged, self.vocab))

    def generate(self, ids: list[list[int]], n: int):
        rows = len(ids)
        ctx, batch = self._context(rows)
        entries = [
            (tok, pos, row, pos == len(p) - 1)
            for row, p in enumerate(ids)
            for pos, tok in enumerate(p)
        ]
        logits = self._decode(ctx, batch, entries)
        out = []
        for step in range(n):
            next_tokens = logits.argmax(axis=-1)
            out.append(next_tokens)
            if step == n - 1:
                break
            logits = self._decode(
                ctx,
                batch,
                [(int(t), len(ids[row]) + step, row, True) for row, t in enumerate(next_tokens)],
            )
        return np.stack(out, axis=1)

    def prefill(self, ids: list[int]):
        """One prompt into the cache, in ubatches of 512 tokens (llama.cpp's own prefill)."""
        ctx, batch = self._context(1, len(ids))
        for start in range(0, len(ids), 512):
            chunk = ids[start : start + 512]
            last = start + len(chunk) == len(ids)
            self._decode(
                ctx,
                batch,
                [(t, start + i, 0, last and i == len(chunk) - 1) for i, t in enumerate(chunk)],
            )


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(spec: dict) -> dict:
    """The measurements of `spec` (this module's docstring) for llama.cpp systems."""
    folder = Path(spec["folder"])
    systems = [
        LlamaCpp(name, Path(path) if outtype is None else requantized_gguf(path, outtype, folder))
        for name, (path, outtype) in spec["systems"].items()
    ]
    prompt, n, repeats = spec["prompt"], spec["new_tokens"], spec["repeats"]
    out = {
        s.name: {
            "weight_bytes": s.weight_bytes,
            "parameters": s.parameters,
            "first": timed(lambda s=s: s.generate([prompt], n)),
            "tokens32": s.generate([prompt], 32).tolist(),
            "times": {},
            "prefill": {},
        }
        for s in systems
    }
    for batch in spec["batches"]:
        for count in (1, n):
            samples = {s.name: [] for s in systems}
            for s in systems:
                s.generate([prompt] * batch, count)
            for _ in range(repeats):
                for s in systems:
                    samples[s.name].append(
                        timed(lambda s=s, b=batch, c=count: s.generate([prompt] * b, c))
                    )
            for name, xs in samples.items():
                out[name]["times"][f"{batch},{count}"] = statistics.median(xs)
    for long_prompt in spec["long_prompts"]:
        samples = {s.name: [] for s in systems}
        for s in systems:
            s.prefill(long_prompt)
        for _ in range(repeats):
            for s in systems:
                samples[s.name].append(timed(lambda s=s, p=long_prompt: s.prefill(p)))
        for name, xs in samples.items():
            out[name]["prefill"][str(len(long_prompt))] = statistics.median(xs)
    return out


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
