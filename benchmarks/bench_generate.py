"""Decode and prefill speed of functional_gen at each weight precision, against transformers and
llama.cpp at the same precision, in one run.

    .venv/bin/python benchmarks/bench_generate.py [--repeats 3] [--new-tokens 128]
        [--systems ours-f32 ours-bf16 ours-int8 ours-int8-copy hf-f32 hf-bf16 llama-f32
                   llama-bf16 llama-q8_0] [--prefill 512,4096]

`--prefill 512,4096` measures only prefill, at each length (the text repeated to length), for
every chosen system in one run: first call (ours: compile included), compile time and the
median time, with the ratio to the first system.

All systems run SmolLM2-135M-Instruct (the embedded default model) on the CPU, greedy, with a
32-token prompt (the same token ids for all):

- `ours-*`: functional_gen with float32, bfloat16 (`dtype="bfloat16"`) or int8
  (`quantization="int8"`, requantized from the shipped Q4_1 GGUF) weights; activations float32.
  `ours-int8-copy` is that int8 model with `quantization.with_batched_int8`'s second copy for
  batched decode (twice the memory; see docs/concepts/weights.md).
- `hf-*`: transformers' PyTorch `generate` in float32 and bfloat16 (2 threads, eager).
- `llama-*`: llama.cpp through `llama-cpp-python` (the optional `bench` extra, which compiles
  for ~14 minutes; skipped with a message when it is not installed) on GGUF files of the same
  weights at f32, bf16 and Q8_0, made on first use by the converter shipped in llama-cpp-python's
  source distribution (`convert_hf_to_gguf.py`, which needs `sentencepiece`) from the converted
  default checkpoint, into `<cache>/bench-gguf/`. It runs through the low-level API so that
  batch 8 is real batched decoding (8 sequences of one context), 2 threads.

Decode tokens/s at batch B is `B * (N - 1) / (T_N - T_1)`, where `T_N` is the wall time of a
`generate` call producing N tokens per row (EOS disabled, so every row produces exactly N); this
removes prefill from the figure. Prefill is one forward over a 512-token prompt that fills the
cache and returns the last position's logits. Each figure is the median of `--repeats` runs, the
systems alternating so that machine drift hits all alike.

Bounds, measured in the same run: decode reads every weight once per step, so its bound is
`B * bandwidth / weight bytes` (bandwidth: a jitted sum over 1 GiB; weight bytes: the system's
own storage, scales included); prefill is bound by arithmetic, `2 * parameters * 512` FLOPs at
the float32 GEMM rate XLA measures here (a bfloat16 system may beat that bound). `% bound` is
the fraction reached. The machine may be shared: compare rows of one run, not runs.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.models import quantization

TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
) * 40
THREADS = 2


def measure_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: a jitted sum over a large float32 array (best of `repeats`)."""
    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        total(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best / 1e9


def measure_flops(n: int = 2048, repeats: int = 5) -> float:
    """float32 GEMM rate of XLA in FLOP/s (best of `repeats` n x n x n products)."""
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Ours:
    def __init__(self, name, transform=None, **load_kwargs):
        import equinox as eqx

        self.name = name
        self.model, self.tokenizer = fg.load_model(**load_kwargs)
        if transform is not None:
            self.model = transform(self.model)
        self.weight_bytes = sum(w.nbytes for w in self.model.named_weights().values())
        self.parameters = sum(
            w.size
            for k, w in self.model.named_weights().items()
            if not k.endswith(".scale") and ".batched." not in k
        )
        self._prefill = eqx.filter_jit(lambda m, x, p: m.prefill(x, p, max_len=x.shape[1] + 1)[0])

    def generate(self, ids: list[list[int]], n: int):
        state = fg.generate_token_ids(self.model, ids, max_new_tokens=n, eos_token_id=())
        jax.block_until_ready(state)
        return np.asarray(state.generated_token_ids(0))

    def prefill(self, ids: list[int]):
        x = jnp.asarray([ids])
        jax.block_until_ready(self._prefill(self.model, x, jnp.arange(len(ids))[None]))


class Transformers:
    def __init__(self, name, dtype):
        import torch
        from transformers import AutoModelForCausalLM

        from functional_gen.loading import ensure_default_checkpoint

        torch.set_num_threads(THREADS)
        self.name = name
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(ensure_default_checkpoint()), dtype=getattr(torch, dtype)
        ).eval()
        params = list(self.model.parameters())  # the tied head is one parameter
        self.weight_bytes = sum(p.numel() * p.element_size() for p in params)
        self.parameters = sum(p.numel() for p in params)

    def generate(self, ids: list[list[int]], n: int):
        torch = self.torch
        x = torch.tensor(ids)
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=2,
            )
        return out[:, x.shape[1] :].numpy()

    def prefill(self, ids: list[int]):
        torch = self.torch
        with torch.inference_mode():
            self.model(torch.tensor([ids]), logits_to_keep=1, use_cache=True)


@contextlib.contextmanager
def _quiet_stderr():
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


def bench_gguf(outtype: str) -> Path:
    """The default model as a GGUF of `outtype` (f32, bf16, q8_0), made once with the converter
    in llama-cpp-python's source distribution (fetched with `pip download` on first use)."""
    import llama_cpp

    from functional_gen.loading import ensure_default_checkpoint
    from functional_gen.loading.default_model import cache_dir

    folder = cache_dir() / "bench-gguf"
    target = folder / f"SmolLM2-135M-Instruct-{outtype}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    version = llama_cpp.__version__
    source = folder / f"llama_cpp_python-{version}"
    converter = source / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not converter.is_file():
        print(f"fetching llama-cpp-python {version}'s source for its GGUF converter...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                str(folder),
            ],
            check=True,
        )
        with tarfile.open(folder / f"llama_cpp_python-{version}.tar.gz") as tar:
            tar.extractall(folder, filter="data")
    print(f"converting the default model to {target.name}...", flush=True)
    tmp = target.with_suffix(".tmp")
    subprocess.run(
        [
            sys.executable,
            str(converter),
            str(ensure_default_checkpoint()),
            "--outtype",
            outtype,
            "--outfile",
            str(tmp),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    tmp.rename(target)
    return target


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API (batched decoding of B sequences)."""

    def __init__(self, name, outtype):
        import llama_cpp as L

        self.L = L
        self.name = name
        path = bench_gguf(outtype)
        with _quiet_stderr():
            L.llama_backend_init()
            self.model = L.llama_model_load_from_file(
                str(path).encode(), L.llama_model_default_params()
            )
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.parameters = L.llama_model_n_params(self.model)
        self.weight_bytes = L.llama_model_size(self.model)
        self.contexts = {}

    def _context(self, rows: int):
        L = self.L
        if rows not in self.contexts:
            p = L.llama_context_default_params()
            p.n_ctx = 1024 * rows
            p.n_batch = p.n_ubatch = 512
            p.n_seq_max = rows
            p.n_threads = p.n_threads_batch = THREADS
            with _quiet_stderr():
                ctx = L.llama_init_from_model(self.model, p)
            self.contexts[rows] = (ctx, L.llama_batch_init(512, 0, rows))
        ctx, batch = self.contexts[rows]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        return ctx, batch

    def _decode(self, ctx, batch, entries):
        """entries: (token, position, sequence, wants logits) -> logits of the flagged ones."""
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
        ctx, batch = self._context(1)
        self._decode(ctx, batch, [(t, i, 0, i == len(ids) - 1) for i, t in enumerate(ids)])


SYSTEMS = {
    "ours-f32": lambda: Ours("ours-f32"),
    "ours-bf16": lambda: Ours("ours-bf16", dtype="bfloat16"),
    "ours-int8": lambda: Ours("ours-int8", quantization="int8"),
    # int8 blocks plus a BatchedInt8 copy for batched decode (quantization.with_batched_int8)
    "ours-int8-copy": lambda: Ours(
        "ours-int8-copy", transform=quantization.with_batched_int8, quantization="int8"
    ),
    "hf-f32": lambda: Transformers("hf-f32", "float32"),
    "hf-bf16": lambda: Transformers("hf-bf16", "bfloat16"),
    "llama-f32": lambda: LlamaCpp("llama-f32", "f32"),
    "llama-bf16": lambda: LlamaCpp("llama-bf16", "bf16"),
    "llama-q8_0": lambda: LlamaCpp("llama-q8_0", "q8_0"),
}

PEERS = {  # each of ours against the others at the same (or the nearest) precision
    "ours-f32": ("hf-f32", "llama-f32"),
    "ours-bf16": ("hf-bf16", "llama-bf16", "ours-f32"),
    "ours-int8": ("llama-q8_0", "ours-f32", "hf-f32"),
    "ours-int8-copy": ("llama-q8_0", "ours-int8", "ours-f32"),
}


def prefill_table(systems, ids: list[int], lengths: list[int], repeats: int) -> None:
    """Prefill time at each prompt length (`--prefill 512,4096`), every system in this run: the
    first call (ours: compile included, the compile time is first call minus the median) and
    the median of `repeats` calls, alternating systems; then ours / each peer."""
    print(f"\nprefill (one forward filling the cache), median of {repeats}, shared machine")
    print("| tokens | system | first call s | compile s | prefill s | ratio to first system |")
    print("|---|---|---|---|---|---|")
    for n in lengths:
        prompt = (ids * (n // len(ids) + 1))[:n]
        first = {s.name: timed(lambda s=s, p=prompt: s.prefill(p)) for s in systems}
        samples = {s.name: [] for s in systems}
        for _ in range(repeats):
            for system in systems:
                samples[system.name].append(timed(lambda s=system, p=prompt: s.prefill(p)))
        median = {k: statistics.median(v) for k, v in samples.items()}
        base = systems[0].name
        for s in systems:
            compiled = first[s.name] - median[s.name] if isinstance(s, Ours) else float("nan")
            print(
                f"| {n} | {s.name} | {first[s.name]:.2f} | {compiled:.2f} | "
                f"{median[s.name]:.2f} | {median[s.name] / median[base]:.2f} |",
                flush=True,
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument(
        "--prefill",
        default=None,
        help="comma-separated prompt lengths, e.g. 512,4096: measure only prefill at each length",
    )
    args = parser.parse_args(argv)
    n = args.new_tokens

    names = list(args.systems)
    if any(s.startswith("llama-") for s in names):
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print(
                "llama-cpp-python is not installed: skipping llama.cpp. Install the `bench` extra "
                "(`pip install -e .[bench]`; it compiles llama.cpp for about 14 minutes) to "
                "compare with it.",
                file=sys.stderr,
            )
            names = [s for s in names if not s.startswith("llama-")]
    systems = [SYSTEMS[s]() for s in names]
    tokenizer = fg.load_model()[1] if not isinstance(systems[0], Ours) else systems[0].tokenizer
    ids = tokenizer(TEXT)["input_ids"]
    prompt = ids[:32]
    long_prompt = ids[: args.prefill_tokens]
    if args.prefill:
        lengths = [int(x) for x in args.prefill.split(",")]
        prefill_table(systems, ids, lengths, args.repeats)
        return 0

    # First call: compilation included (ours); the others have nothing to compile.
    first = {s.name: timed(lambda s=s: s.generate([prompt], n)) for s in systems}
    reference = systems[0].generate([prompt], 32)
    same = {s.name: bool(np.array_equal(s.generate([prompt], 32), reference)) for s in systems}

    times = {}
    for batch in args.batches:
        for count in (1, n):
            for system in systems:
                system.generate([prompt] * batch, count)  # warm-up (compiles this shape)
            samples = {s.name: [] for s in systems}
            for _ in range(args.repeats):
                for system in systems:
                    samples[system.name].append(
                        timed(lambda s=system, b=batch, n=count: s.generate([prompt] * b, n))
                    )
            for name, xs in samples.items():
                times[(name, batch, count)] = statistics.median(xs)

    for system in systems:
        system.prefill(long_prompt)  # warm-up
    prefill = {s.name: [] for s in systems}
    for _ in range(args.repeats):
        for system in systems:
            prefill[system.name].append(timed(lambda s=system: s.prefill(long_prompt)))
    prefill = {k: statistics.median(v) for k, v in prefill.items()}

    bandwidth = measure_bandwidth()
    flops = measure_flops()

    def decode_rate(name, batch):
        spent = times[(name, batch, n)] - times[(name, batch, 1)]
        # on a loaded machine T_1 can exceed T_N: no figure rather than a negative one
        return batch * (n - 1) / spent if spent > 0 else float("nan")

    print(
        f"\nSmolLM2-135M-Instruct, greedy, 32-token prompt, {n} new tokens, median of "
        f"{args.repeats}; jax {jax.__version__}, {os.cpu_count()} CPUs; memory bandwidth "
        f"{bandwidth:.1f} GB/s, float32 GEMM {flops / 1e9:.0f} GFLOP/s (both measured now)"
    )
    header = f"{'system':<11} {'weights MB':>10}"
    for batch in args.batches:
        header += f" {f'decode B={batch} tok/s':>18} {'% bound':>7}"
    header += f" {f'prefill {len(long_prompt)} s':>12} {'% bound':>7} {'first call s':>12}"
    print(header)
    base = systems[0].name
    for s in systems:
        row = f"{s.name:<11} {s.weight_bytes / 1e6:>10.0f}"
        for batch in args.batches:
            rate = decode_rate(s.name, batch)
            bound = batch * bandwidth * 1e9 / s.weight_bytes
            row += f" {rate:>18.1f} {rate / bound:>7.0%}"
        prefill_bound = 2 * s.parameters * len(long_prompt) / flops
        row += f" {prefill[s.name]:>12.3f} {prefill_bound / prefill[s.name]:>7.0%}"
        row += f" {first[s.name]:>12.2f}"
        print(row)
    present = {s.name: s for s in systems}
    print(
        "\nspeed-ups of ours over the same precision elsewhere (decode tok/s ratio; prefill time ratio):"
    )
    for ours, peers in PEERS.items():
        for peer in peers:
            if ours in present and peer in present:
                cells = [
                    f"decode B={b} {decode_rate(ours, b) / decode_rate(peer, b):.2f}x"
                    for b in args.batches
                ]
                cells.append(f"prefill {prefill[peer] / prefill[ours]:.2f}x")
                print(f"  {ours} vs {peer}: " + ", ".join(cells))
    print(f"\ngreedy 32 tokens identical to {base}'s: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
