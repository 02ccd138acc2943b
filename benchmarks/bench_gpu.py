"""Decode and prefill speed of functional_gen on one GPU against transformers on the same GPU, on
random-weight checkpoints of real model shapes, in one process (issue 54's device benchmark).

    python benchmarks/bench_gpu.py --tokenizer DIR [--shapes llama-3.2-1b llama-3.1-8b ...]
        [--batches 1 8 64] [--new-tokens 16 80] [--prefill-tokens 2048 8192] [--prefill-32k]
        [--repeats 3] [--budget-s 400] [--plan gpu|cpu] [--hf-compile auto|on|off]
        [--no-smoke] [--profile] [--out DIR] [--scratch DIR] [--tiny]
    python benchmarks/bench_gpu.py --save-tokenizer DIR   # here: the default model's tokenizer

**Shapes.** `smollm2-135m`, `llama-3.2-1b`, `llama-3.1-8b` (transformers' `LlamaConfig`) and
`gemma-3-1b` (`Gemma3TextConfig`), each with the published config's numbers (hidden,
intermediate, layers, heads, key-value heads, head size, vocabulary, RoPE theta and scaling,
tied embeddings; `SHAPES` below). Each checkpoint is made on the machine with random weights
(`XForCausalLM(config)` built in bfloat16 on the device, `save_pretrained` into `--scratch`),
with the tokenizer of `--tokenizer` (the default model's, saved by `--save-tokenizer`) copied
beside it. Nothing is downloaded. `--tiny` replaces every shape by a 2-layer model of the same
family (hidden 64), two shapes by default (`smollm2-135m`, `gemma-3-1b`), batches 1 and 2, short
runs: that is how the script is tested without a GPU (on the shared 2-core box, 2026-11-28: one
shape with `--no-smoke` in 3-8 minutes, nearly all of it XLA compiling; each smoke check 40-200 s
there; pick some with `--smoke NAME ...`, or pass `--tokenizer` to skip loading the default
model).

**Systems,** each on the same checkpoint and the same 32-token prompt, greedy, EOS off:

- `ours`: `fg.load_model(path, dtype="bfloat16", kv_cache_dtype="bfloat16")` with
  `model.with_plan(fg.models.ExecutionPlan.for_backend(--plan))` (`--plan` defaults to the
  backend JAX runs on); decode through `fg.generate_token_ids(model, ids, max_new_tokens=n,
  eos_token_id=())`, one compiled program for prefill and the whole decode loop.
- `ours-int8`: the same with `quantization="int8"` (batch 1 only).
- `hf-eager`: transformers' `generate` on the torch model that made the checkpoint (bf16,
  attention through SDPA), `do_sample=False`, `min_new_tokens=max_new_tokens`.
- `hf-compiled`: the same with `cache_implementation="static"`, under which transformers
  compiles the forward pass with `torch.compile` on a GPU (its automatic compilation). On a CPU
  transformers does not compile it: the row is then a static cache without `torch.compile`,
  flagged, unless `--hf-compile on`.

**Figures.** Decode tokens/s at batch B is `B * (N2 - N1) / (T(N2) - T(N1))`, `T(N)` the median
wall time of a call that makes N new tokens per row (`--new-tokens N1 N2`), which removes
prefill and the fixed cost of a call; ms/step is `(T(N2) - T(N1)) / (N2 - N1)`. Prefill is one
forward over a prompt of each `--prefill-tokens` length that fills a cache and returns the last
position's logits (ours: `model.prefill` jitted; transformers: `model(ids, logits_to_keep=1)`).
First call: the first call's wall time minus the median (the compile time, for ours and
`hf-compiled`). Bound: a decode step reads every weight once (the embedding table only when it
is also the output head) plus each row's KV cache at the mean length, so batch B is bound by
`B * bandwidth / (weight bytes + B * mean length * KV bytes per token)`, the bandwidth measured
in this run by a device-to-device copy through torch (bytes read plus bytes written, best of
10). Every figure is the median of `--repeats`, the systems alternating.

**Time.** The script measures in priority order (ours and transformers eager on every shape,
then the smoke section, then `hf-compiled`, int8 and the longer prefills) and starts nothing
once `--budget-s` seconds have passed (each task reserves an estimate of its own time): a task
not run is marked "skipped (time budget)", never silently missing. Every figure goes to
`--out/bench_gpu.json` as soon as it is measured, so a killed run keeps what it had.

**Smoke** (`--no-smoke` to leave out): one short run each of processors (temperature, top-k,
top-p, repetition penalty), structured generation (a regex and a JSON Schema, outputs checked
with `re.fullmatch` / `json.loads` + `jsonschema` unless cut short), beam search, CFG,
`SequenceState` continue / save / load, speculative decoding (`PromptLookup`, checked equal to
plain greedy), the serving `Engine` and sharding over a 1-device mesh (tokens compared with the
unsharded model's), on a 2-layer checkpoint of the `smollm2-135m` shape (or the first shape;
the same programs as the full depth, compiled faster) with the GPU plan, bf16 weights and
cache: each reported ok or failed with its exception; none aborts the run.

**Profile** (`--profile`): a `jax.profiler` trace of batch-1 decode calls of the first shape,
written as `--out/decode.xplane.pb` (open it with TensorBoard's profile plugin or xprof), and a
breakdown of its device time by kernel kind (matmuls, attention, copies, other) and the gaps
between kernels, per decode step, printed and saved in the JSON.

How a session runs it on the device machine: `benchmarks/gpu_run.sh` (its comments list the
wheels to carry, their sizes, and the one command line).
"""

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "--xla-command-buffers" in sys.argv:  # XLA reads it when its backend starts: at the imports
    _flag = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import timed  # this folder's module

TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
) * 2000  # more than 32,768 tokens with the default model's tokenizer

LLAMA3_ROPE = dict(
    rope_type="llama3",
    high_freq_factor=4.0,
    low_freq_factor=1.0,
    original_max_position_embeddings=8192,
)
# The published configs' numbers (config.json of each model on the Hugging Face hub).
SHAPES = {
    "smollm2-135m": dict(
        label="SmolLM2-135M",
        family="llama",
        config=dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            vocab_size=49152,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=100000.0),
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
    ),
    "llama-3.2-1b": dict(
        label="Llama-3.2-1B",
        family="llama",
        config=dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=128256,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=32.0),
            tie_word_embeddings=True,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    "llama-3.1-8b": dict(
        label="Llama-3.1-8B",
        family="llama",
        config=dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=8.0),
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    "gemma-3-1b": dict(
        label="Gemma-3-1B",
        family="gemma3",
        config=dict(
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            vocab_size=262144,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=256,
            sliding_window=512,
            # 5 sliding-window layers, then 1 global one (sliding_window_pattern 6)
            layer_types=[
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)
            ],
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="default", rope_theta=1000000.0),
            ),
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
}
# --tiny: each family's structure at 2 layers (the vocabulary still covers the tokenizer's ids)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=49152,
)
TINY_GEMMA = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])


def shape_config(name: str, tiny: bool):
    """The transformers config of shape `name` (its 2-layer version when `tiny`)."""
    from transformers import Gemma3TextConfig, LlamaConfig

    spec = SHAPES[name]
    fields = dict(spec["config"])
    if tiny:
        fields.update(TINY, **(TINY_GEMMA if spec["family"] == "gemma3" else {}))
    cls = Gemma3TextConfig if spec["family"] == "gemma3" else LlamaConfig
    return cls(**fields)


def make_checkpoint(
    name: str, folder: Path, tokenizer_dir: Path, tiny: bool, device: str, layers: int | None = None
):
    """A random-weight bfloat16 checkpoint of shape `name` (with `layers` layers when given)
    saved in `folder` (the tokenizer's files copied beside it); returns the torch model that
    made it, in eval mode on `device`."""
    import torch
    from transformers import Gemma3ForCausalLM, LlamaForCausalLM

    config = shape_config(name, tiny)
    if layers is not None:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    cls = Gemma3ForCausalLM if SHAPES[name]["family"] == "gemma3" else LlamaForCausalLM
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no float32 copy on the device
    try:
        with torch.device(device):
            model = cls(config).to(torch.bfloat16)
    finally:
        torch.set_default_dtype(default)
    if hasattr(model, "set_attn_implementation"):
        with contextlib.suppress(Exception):
            model.set_attn_implementation("sdpa")
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, folder / f.name)
    return model


def measure_copy_bandwidth(device: str, gib: float) -> float:
    """Device memory bandwidth in GB/s: bytes read plus bytes written by a device-to-device copy
    of `gib` GiB through torch, best of 10 (CUDA events on a GPU, a wall clock on a CPU)."""
    import torch

    n = int(gib * 2**30)
    a = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    b = torch.empty_like(a)
    best = float("inf")
    for i in range(13):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            b.copy_(a)
            end.record()
            torch.cuda.synchronize()
            took = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            b.copy_(a)
            took = time.perf_counter() - t
        if i >= 3:  # warm-ups first
            best = min(best, took)
    del a, b
    return 2 * n / best / 1e9


class Budget:
    """Seconds since the start, against `--budget-s`: a task starts only when its reserve fits."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, reserve: float) -> bool:
        return self.elapsed() + reserve <= self.seconds


class Ours:
    """functional_gen on a checkpoint, with the execution plan `plan` and a `kv_cache_dtype` KV
    cache (bf16 by default) where the installed package has those (each fallback is noted in
    `notes`)."""

    def __init__(self, path: Path, plan: str, kv_cache_dtype: str = "bfloat16", **load_kwargs):
        self.notes = []
        try:
            self.model, self.tokenizer = fg.load_model(
                path, kv_cache_dtype=kv_cache_dtype, **load_kwargs
            )
        except TypeError as e:
            if "kv_cache_dtype" not in str(e):
                raise
            self.notes.append("fg.load_model has no kv_cache_dtype: the model's default cache")
            self.model, self.tokenizer = fg.load_model(path, **load_kwargs)
        plan_cls = getattr(fg.models, "ExecutionPlan", None)
        if plan_cls is None or not hasattr(self.model, "with_plan"):
            self.notes.append("no fg.models.ExecutionPlan / with_plan: the default plan")
        else:
            chosen = plan_cls.for_backend(plan)
            if plan == "gpu" and jax.default_backend() != "gpu":
                chosen = chosen.replace(attention_implementation=None)  # no cuDNN here
                self.notes.append("GPU plan on a CPU: attention_implementation=None")
            self.model = self.model.with_plan(chosen)
        named = self.model.named_weights()
        stored = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(self.model, eqx.is_array)))
        tied = not any(k.startswith("lm_head.") for k in named)
        table = sum(v.nbytes for k, v in named.items() if k.startswith("model.embed_tokens."))
        self.weight_bytes = stored  # all of it on the device
        self.step_bytes = stored if tied else stored - table  # read per decode step
        cache = jax.eval_shape(lambda: self.model.init_cache(1, 256))
        leaves = [x for x in jax.tree.leaves(cache) if x.ndim >= 3]  # k and v buffers
        self.kv_bytes_per_token = sum(x.size * x.dtype.itemsize for x in leaves) / 256
        self.cache_dtype = str(leaves[0].dtype) if leaves else "?"
        self._prefill = eqx.filter_jit(lambda m, x, p: m.prefill(x, p, max_len=x.shape[1] + 1)[0])

    def generate(self, ids: list[list[int]], n: int) -> np.ndarray:
        state = fg.generate_token_ids(self.model, ids, max_new_tokens=n, eos_token_id=())
        jax.block_until_ready(state)
        return np.asarray(state.generated_token_ids(0))

    def prefill(self, ids: list[int]) -> None:
        x = jnp.asarray([ids])
        jax.block_until_ready(self._prefill(self.model, x, jnp.arange(len(ids))[None]))


class Transformers:
    """transformers' `generate` on the torch model, eager (`static=False`) or with a static
    cache (compiled by transformers on a GPU, or when `compile_everywhere`)."""

    def __init__(self, model, device: str, static: bool, compile_everywhere: bool = False):
        import torch

        self.torch, self.model, self.device, self.static = torch, model, device, static
        self.kwargs = {}
        if static:
            self.kwargs = dict(cache_implementation="static")
        if static and compile_everywhere:  # transformers' own criterion: not on a CPU
            from transformers.generation.configuration_utils import CompileConfig

            compile_config = CompileConfig()
            compile_config._compile_all_devices = True
            self.kwargs["compile_config"] = compile_config
        params = list(model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in params)
        self.attention = getattr(model.config, "_attn_implementation", "?")

    def _sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def generate(self, ids: list[list[int]], n: int) -> np.ndarray:
        torch = self.torch
        x = torch.tensor(ids, device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=0,
                eos_token_id=None,
                **self.kwargs,
            )
        self._sync()
        return out[:, x.shape[1] :].cpu().numpy()

    def prefill(self, ids: list[int]) -> None:
        torch = self.torch
        with torch.inference_mode():
            self.model(torch.tensor([ids], device=self.device), logits_to_keep=1, use_cache=True)
        self._sync()


def decode_times(system, prompt, batch, counts, repeats) -> dict:
    """Median wall time of `generate` at each token count in `counts` (alternating), after a
    first call of each (compilation included), and the greedy tokens of row 0."""
    first = {n: timed(lambda n=n: system.generate([prompt] * batch, n)) for n in counts}
    samples = {n: [] for n in counts}
    tokens = None
    for _ in range(repeats):
        for n in counts:
            t = time.perf_counter()
            tokens = system.generate([prompt] * batch, n)
            samples[n].append(time.perf_counter() - t)
    median = {n: statistics.median(v) for n, v in samples.items()}
    n1, n2 = counts
    spent = median[n2] - median[n1]
    out = {
        "t_n1_s": median[n1],
        "t_n2_s": median[n2],
        "tok_s": batch * (n2 - n1) / spent if spent > 0 else float("nan"),
        "ms_step": 1e3 * spent / (n2 - n1),
        "tokens_row0": np.asarray(tokens)[0].tolist(),
    }
    out["first_call_s"] = first[n2]
    out["compile_s"] = first[n2] - median[n2]
    return out


def prefill_time(system, ids, repeats) -> dict:
    first = timed(lambda: system.prefill(ids))
    median = statistics.median(timed(lambda: system.prefill(ids)) for _ in range(repeats))
    return {"ms": 1e3 * median, "first_call_s": first, "compile_s": first - median}


# ---------------------------------------------------------------- smoke section (issue item 7)


SMOKE_CHECKS = (
    "processors",
    "regex",
    "json_schema",
    "beam_search",
    "cfg",
    "sequence_state",
    "speculative_prompt_lookup",
    "serving_engine",
    "sharding_1_device_mesh",
)


def smoke_checks(model, tokenizer, names=SMOKE_CHECKS) -> dict:
    """One short run of each capability in `names` (`SMOKE_CHECKS`) on `model`; name -> "ok
    ..." or "failed: ...". Never raises."""
    import jsonschema

    key = jax.random.key(0)
    prompt = "The capital of France is"
    greedy = dict(max_new_tokens=8, eos_token_id=())

    def processors():
        r = fg.generate(
            model,
            tokenizer,
            [prompt, "Once upon a time"],
            max_new_tokens=8,
            processors=[
                fg.processors.RepetitionPenalty(1.2),
                fg.processors.Temperature(0.7),
                fg.processors.TopK(20),
                fg.processors.TopP(0.9),
            ],
            sampler=fg.samplers.Multinomial(),
            key=key,
        )
        return f"ok {r.finish_reasons}"

    def regex():
        pattern = r"[0-9]{3}-[0-9]{4}"
        r = fg.generate(
            model,
            tokenizer,
            [prompt],
            processors=[fg.processors.Regex(pattern, tokenizer)],
            max_new_tokens=16,
        )
        text, reason = r.texts[0], r.finish_reasons[0]
        if re.fullmatch(pattern, text):
            return f"ok matches {text!r} ({reason})"
        if reason != "length":
            raise AssertionError(f"{text!r} does not match {pattern} (finish {reason})")
        return f"ok (cut short) {text!r}"

    def json_schema():
        schema = {
            "type": "object",
            "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["age"],
            "additionalProperties": False,
        }
        r = fg.generate(
            model,
            tokenizer,
            [prompt],
            processors=[fg.processors.JsonSchema(schema, tokenizer)],
            max_new_tokens=24,
        )
        text, reason = r.texts[0], r.finish_reasons[0]
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            if reason == "length":  # cut short by max_new_tokens: a prefix of a valid value
                return f"ok (cut short) {text!r}"
            raise
        jsonschema.validate(value, schema)
        return f"ok valid {text!r} ({reason})"

    def beams():
        r = fg.generate(
            model,
            tokenizer,
            [prompt],
            sampler=fg.samplers.BeamSearch(num_beams=4),
            num_return_sequences=2,
            **greedy,
        )
        return f"ok scores {np.asarray(r.sequences_scores).round(3).tolist()}"

    def cfg():
        r = fg.generate(
            model, tokenizer, [prompt], guidance_scale=1.5, negative_prompt="Paris", **greedy
        )
        return f"ok {r.texts[0]!r}"

    def sequence_state():
        r = fg.generate(model, tokenizer, [prompt], **greedy)
        more = fg.generate(model, tokenizer, r.state, max_new_tokens=4, eos_token_id=())
        with tempfile.TemporaryDirectory() as d:
            r.state.save(Path(d) / "state")
            again = fg.generate(
                model,
                tokenizer,
                fg.SequenceState.load(Path(d) / "state"),
                max_new_tokens=4,
                eos_token_id=(),
            )
        same = np.array_equal(np.asarray(more.token_ids), np.asarray(again.token_ids))
        if not same:
            raise AssertionError("continuing a saved and loaded state gave other tokens")
        return "ok continue == load + continue"

    def speculative():
        plain = fg.generate(model, tokenizer, [prompt * 3], **greedy)
        fast = fg.generate(
            model,
            tokenizer,
            [prompt * 3],
            speculative=fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2),
            **greedy,
        )
        if not np.array_equal(np.asarray(plain.token_ids), np.asarray(fast.token_ids)):
            raise AssertionError("PromptLookup's greedy tokens differ from plain greedy's")
        return "ok equal to plain greedy"

    def engine():
        server = fg.serving.Engine(model, tokenizer, max_slots=2, max_len=64)

        async def collect():
            return [p async for p in server.stream(prompt, fg.GenerationOptions(max_new_tokens=6))]

        pieces = asyncio.run(collect())
        return f"ok {''.join(pieces)!r}"

    def sharding():
        sharded = fg.shard(model, fg.make_mesh(1, 1))
        ids = tokenizer(prompt)["input_ids"]
        a = fg.generate_token_ids(sharded, [ids], max_new_tokens=4, eos_token_id=())
        b = fg.generate_token_ids(model, [ids], max_new_tokens=4, eos_token_id=())
        same = np.array_equal(
            np.asarray(a.generated_token_ids(0)), np.asarray(b.generated_token_ids(0))
        )
        return f"ok tokens {'equal' if same else 'DIFFER'} unsharded"

    checks = dict(
        processors=processors,
        regex=regex,
        json_schema=json_schema,
        beam_search=beams,
        cfg=cfg,
        sequence_state=sequence_state,
        speculative_prompt_lookup=speculative,
        serving_engine=engine,
        sharding_1_device_mesh=sharding,
    )
    results = {}
    for name in names:
        check = checks[name]
        t = time.perf_counter()
        try:
            results[name] = check()
        except Exception as e:  # reported, never fatal
            tail = traceback.format_exc().strip().splitlines()[-3:]
            results[name] = f"failed: {type(e).__name__}: {e} | {' / '.join(tail)}"[:600]
        results[name] += f" [{time.perf_counter() - t:.1f} s]"
        print(f"  smoke {name}: {results[name]}", flush=True)
    return results


# ---------------------------------------------------------------- profile


KINDS = (  # kernel name pattern -> kind, first match wins
    ("attention", re.compile(r"attn|attention|flash|cudnn|fmha|softmax|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|cublas|cutlass|matmul|dot|xmma|wgmma|sm90_", re.I)),
    ("copies", re.compile(r"memcpy|memset|copy|dynamic.update.slice", re.I)),
)


def profile_breakdown(path: Path, steps: int) -> dict:
    """Device time per decode step by kernel kind from an xplane trace: the busy time of each
    kind, the span from the first kernel to the last, and the gaps (span minus busy time), in
    ms per step (`steps` decode steps in the trace). Host planes only when no device plane."""
    data = jax.profiler.ProfileData.from_file(str(path))
    planes = [p for p in data.planes if p.name.startswith("/device:")] or [
        p for p in data.planes if p.name.startswith("/host:")
    ]
    busy = {kind: 0 for kind, _ in KINDS} | {"other": 0}
    intervals = []
    for plane in planes:
        # GPU planes: the kernel lines ("Stream #..."), not XLA's per-op/module summary lines
        streams = [x for x in plane.lines if x.name.startswith("Stream")]
        for line in streams or [x for x in plane.lines if "XLA" not in x.name]:
            for event in line.events:
                kind = next((k for k, rx in KINDS if rx.search(event.name)), "other")
                busy[kind] += event.duration_ns
                intervals.append((event.start_ns, event.end_ns))
    if not intervals:
        return {"planes": [p.name for p in data.planes], "note": "no events"}
    intervals.sort()
    union, (lo, hi) = 0, intervals[0]
    for a, b in intervals[1:]:
        if a > hi:
            union, lo, hi = union + hi - lo, a, b
        else:
            hi = max(hi, b)
    union += hi - lo
    span = max(b for _, b in intervals) - intervals[0][0]
    per = lambda ns: round(ns / 1e6 / steps, 4)  # noqa: E731
    return {
        "planes": [p.name for p in planes],
        "ms_per_step": {k: per(v) for k, v in busy.items()}
        | {"busy (union)": per(union), "gaps": per(span - union), "span": per(span)},
        "kernels": len(intervals),
        "kernels_per_step": round(len(intervals) / steps, 1),
    }


def run_profile(ours: Ours, prompt, n: int, out: Path, calls: int = 3) -> dict:
    ours.generate([prompt], n)  # compiled before tracing
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                ours.generate([prompt], n)
        found = sorted(Path(d).rglob("*.xplane.pb"))
        if not found:
            return {"note": "no xplane.pb written"}
        shutil.copy(found[-1], out / "decode.xplane.pb")
    result = profile_breakdown(out / "decode.xplane.pb", steps=calls * n)
    result["trace"] = str(out / "decode.xplane.pb")
    result["note"] = f"{calls} calls of {n} new tokens at batch 1, prefill included"
    return result


# ---------------------------------------------------------------- the run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokenizer", type=Path, help="a saved tokenizer folder (--save-tokenizer)"
    )
    parser.add_argument(
        "--save-tokenizer", type=Path, help="save the default model's tokenizer here and exit"
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["llama-3.2-1b", "llama-3.1-8b", "smollm2-135m", "gemma-3-1b"],
        choices=list(SHAPES),
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--new-tokens", type=int, nargs=2, default=[16, 80], metavar=("N1", "N2"))
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument(
        "--prefill-32k", action="store_true", help="also 32,768 tokens on llama-3.1-8b, last"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--plan", choices=["gpu", "cpu"], help="default: the backend JAX runs on")
    parser.add_argument(
        "--hf-compile", choices=["auto", "on", "off"], default="auto", help="auto: on a GPU only"
    )
    parser.add_argument(
        "--xla-command-buffers",
        action="store_true",
        help="add --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL to XLA_FLAGS (every "
        "program, process-wide; the generate program already sets it per program under the "
        "GPU plan: this compares the two)",
    )
    parser.add_argument("--no-smoke", action="store_true")
    parser.add_argument(
        "--smoke", nargs="+", default=list(SMOKE_CHECKS), choices=SMOKE_CHECKS, help="which checks"
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench_gpu_out"))
    parser.add_argument(
        "--scratch", type=Path, help="where the checkpoints go (default: a temporary folder)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="2-layer shapes and short settings: a CPU test"
    )
    args = parser.parse_args(argv)

    if args.save_tokenizer:
        fg.load_model()[1].save_pretrained(args.save_tokenizer)
        print(f"saved the default model's tokenizer in {args.save_tokenizer}")
        return 0
    import torch

    if args.tiny:  # everything short, unless asked for
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        if "--shapes" not in given:
            args.shapes = ["smollm2-135m", "gemma-3-1b"]  # one of each family
        if "--batches" not in given:
            args.batches = [1, 2]
        if "--new-tokens" not in given:
            args.new_tokens = [4, 12]
        if "--prefill-tokens" not in given:
            args.prefill_tokens = [64, 128]
        if "--repeats" not in given:
            args.repeats = 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))  # beside JAX's own threads
    backend = jax.default_backend()
    plan = args.plan or ("gpu" if backend == "gpu" else "cpu")
    hf_compile = args.hf_compile == "on" or (args.hf_compile == "auto" and device == "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    budget = Budget(args.budget_s)
    scale = 0.05 if args.tiny else 1.0  # the tasks' time reserves
    n1, n2 = args.new_tokens

    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        tokenizer_dir = scratch / "tokenizer"
        fg.load_model()[1].save_pretrained(tokenizer_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer(TEXT)["input_ids"]
    prompt = ids[:32]

    results = {
        "device": torch.cuda.get_device_name()
        if device == "cuda"
        else f"CPU ({os.cpu_count()} cores)",
        "jax": jax.__version__,
        "jax_backend": backend,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "plan": plan,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "tiny": args.tiny,
        "settings": vars(args) | {"out": str(args.out), "scratch": str(scratch)},
        "shapes": {},
        "skipped": [],
        "errors": {},
        "log": [],
    }

    def save():
        (args.out / "bench_gpu.json").write_text(json.dumps(results, indent=1, default=str))

    # lazily built, then kept: checkpoints (with their torch model), our models, transformers
    made, systems = {}, {}

    def torch_model(shape):
        if shape not in made:
            t = time.perf_counter()
            made[shape] = make_checkpoint(shape, scratch / shape, tokenizer_dir, args.tiny, device)
            entry(shape)["checkpoint_s"] = time.perf_counter() - t
        return made[shape]

    def system(shape, name):
        if (shape, name) not in systems:
            t = time.perf_counter()
            model = torch_model(shape)
            if name == "ours":
                s = Ours(scratch / shape, plan, dtype="bfloat16")
            elif name == "ours-int8":
                s = Ours(scratch / shape, plan, quantization="int8")
            elif name == "hf-eager":
                s = Transformers(model, device, static=False)
            else:
                s = Transformers(
                    model, device, static=True, compile_everywhere=args.hf_compile == "on"
                )
            info = entry(shape).setdefault(name, {})
            info["load_s"] = time.perf_counter() - t
            info["weight_bytes"] = s.weight_bytes
            if isinstance(s, Ours):
                info |= {
                    "step_bytes": s.step_bytes,
                    "kv_bytes_per_token": s.kv_bytes_per_token,
                    "cache_dtype": s.cache_dtype,
                    "notes": s.notes,
                }
            else:
                info["attention"] = s.attention
                if name == "hf-compiled" and not hf_compile:
                    info["notes"] = [
                        "static cache WITHOUT torch.compile (transformers compiles on a GPU only; --hf-compile on)"
                    ]
            systems[(shape, name)] = s
        return systems[(shape, name)]

    def entry(shape):
        return results["shapes"].setdefault(shape, {"label": SHAPES[shape]["label"]})

    def decode(shape, name, batch):
        r = decode_times(system(shape, name), prompt, batch, (n1, n2), args.repeats)
        entry(shape)[name].setdefault("decode", {})[batch] = r
        step = f"{r['ms_step']:.2f} ms/step"
        return f"{r['tok_s']:.0f} tok/s, {step}" + (
            f", first call {r['first_call_s']:.1f} s" if "first_call_s" in r else ""
        )

    def prefill(shape, name, length):
        if len(ids) < length:
            raise ValueError(f"the text has only {len(ids)} tokens, not {length}")
        r = prefill_time(system(shape, name), ids[:length], args.repeats)
        entry(shape)[name].setdefault("prefill", {})[length] = r
        return f"{r['ms']:.1f} ms, first call {r['first_call_s']:.1f} s"

    def bandwidth():
        gib = 0.25 if args.tiny else 4.0
        results["copy_bandwidth_gb_s"] = measure_copy_bandwidth(device, gib)
        return f"{results['copy_bandwidth_gb_s']:.0f} GB/s"

    # (phase, name, reserve seconds, function), run phase by phase: the first two shapes' main
    # figures, then the smoke checks and the profile, then the other shapes and int8, then
    # the longer prefills and transformers' compiled batches
    big = lambda shape: 2.5 if "8b" in shape else 1.0  # noqa: E731
    tasks = [(1, "bandwidth", 5, bandwidth)]

    def add(phase, shape, what, reserve, fn, *fn_args):
        tasks.append((phase, f"{shape}: {what}", reserve * big(shape), lambda: fn(shape, *fn_args)))

    first_prefill, later_prefill = args.prefill_tokens[:1], args.prefill_tokens[1:]
    for i, shape in enumerate(args.shapes):
        phase = 1 if i < 2 else 3
        add(phase, shape, "checkpoint", 30, lambda s: (torch_model(s), "made")[1])
        for b in args.batches:
            add(phase, shape, f"ours decode B{b}", 25, decode, "ours", b)
        for b in args.batches:
            add(phase, shape, f"hf-eager decode B{b}", 15, decode, "hf-eager", b)
        add(phase if i < 2 else 4, shape, "hf-compiled decode B1", 60, decode, "hf-compiled", 1)
        for k in first_prefill:
            add(phase, shape, f"ours prefill {k}", 15, prefill, "ours", k)
            add(phase, shape, f"hf-eager prefill {k}", 5, prefill, "hf-eager", k)
        add(3, shape, "ours-int8 decode B1", 30, decode, "ours-int8", 1)
        for k in later_prefill:
            add(4, shape, f"ours prefill {k}", 20, prefill, "ours", k)
            add(4, shape, f"hf-eager prefill {k}", 5, prefill, "hf-eager", k)
        for b in args.batches[1:]:
            add(4, shape, f"hf-compiled decode B{b}", 50, decode, "hf-compiled", b)
    if args.prefill_32k and "llama-3.1-8b" in args.shapes:
        for name in ("ours", "hf-eager"):
            add(5, "llama-3.1-8b", f"{name} prefill 32768", 25, prefill, name, 32768)
    smoke_shape = "smollm2-135m" if "smollm2-135m" in args.shapes else args.shapes[0]
    if not args.no_smoke:

        def smoke():  # on 2 layers of the shape: the same programs, compiled faster
            folder = scratch / "smoke"
            make_checkpoint(smoke_shape, folder, tokenizer_dir, args.tiny, device, layers=2)
            s = Ours(folder, plan, dtype="bfloat16")
            results["smoke"] = {"shape": f"{smoke_shape}, 2 layers"} | smoke_checks(
                s.model, s.tokenizer, args.smoke
            )
            bad = [k for k, v in results["smoke"].items() if v.startswith("failed")]
            return f"{len(results['smoke']) - 1 - len(bad)} ok, failed: {bad}"

        tasks.append((2, "smoke", 60, smoke))
    if args.profile:

        def profile():
            shape = args.shapes[0]
            results["profile"] = {"shape": shape} | run_profile(
                system(shape, "ours"), prompt, n2, args.out
            )
            return json.dumps(results["profile"].get("ms_per_step"))

        tasks.append((2, "profile", 20, profile))
    tasks = [task[1:] for task in sorted(tasks, key=lambda task: task[0])]  # stable

    print(
        f"{results['device']}, jax {jax.__version__} ({backend}), plan {plan!r}, torch {torch.__version__}, "
        f"transformers {results['transformers']}; {len(tasks)} tasks, budget {args.budget_s:.0f} s",
        flush=True,
    )
    failed_shapes = set()
    for name, reserve, fn in tasks:
        shape = name.split(":")[0]
        if shape in failed_shapes:
            results["skipped"].append(f"{name} (its checkpoint failed)")
            continue
        if not budget.fits(reserve * scale):
            results["skipped"].append(f"{name} (time budget)")
            print(f"[{budget.elapsed():6.1f} s] {name}: skipped (time budget)", flush=True)
            continue
        t = time.perf_counter()
        try:
            said = fn()
        except Exception as e:  # recorded; the run goes on
            said = f"FAILED {type(e).__name__}: {str(e)[:300]}"
            results["errors"][name] = traceback.format_exc()[-3000:]
            if name.endswith("checkpoint"):
                failed_shapes.add(shape)
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        line = f"[{budget.elapsed():6.1f} s] {name}: {said} ({time.perf_counter() - t:.1f} s)"
        results["log"].append(line)
        print(line, flush=True)
        save()
    results["total_s"] = budget.elapsed()
    save()
    print(
        report(
            results,
            args.batches,
            args.prefill_tokens + ([32768] if args.prefill_32k else []),
            n1,
            n2,
        )
    )
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def report(results: dict, batches, lengths, n1: int, n2: int) -> str:
    """The markdown tables: per shape and system, decode tok/s (ms/step) per batch with the
    bandwidth bound's %, prefill ms, first-call s; then ours' ratios to each peer."""
    bw = results.get("copy_bandwidth_gb_s")
    lines = [
        "",
        f"{results['device']}; jax {results['jax']} ({results['jax_backend']}), plan {results['plan']!r}"
        f" (XLA_FLAGS {results['xla_flags']!r}); "
        f"torch {results['torch']}, transformers {results['transformers']}; copy bandwidth "
        + (f"{bw:.0f} GB/s" if bw else "not measured")
        + f"; greedy, 32-token prompt, decode = B*(N2-N1)/(T(N2)-T(N1)), N1={n1}, N2={n2}; "
        "(% of the bandwidth bound)",
        "",
        "| shape | system | weights GB | "
        + " | ".join(f"B{b} tok/s" for b in batches)
        + " | "
        + " | ".join(f"prefill {k} ms" for k in lengths)
        + " | first call s |",
        "|---|---|---|" + "---|" * (len(batches) + len(lengths) + 1),
    ]
    ratios = []
    for _shape, e in results["shapes"].items():
        ours = e.get("ours", {})
        step_bytes, kv = ours.get("step_bytes"), ours.get("kv_bytes_per_token", 0)
        for name in ("ours", "ours-int8", "hf-eager", "hf-compiled"):
            s = e.get(name)
            if not s or not (s.get("decode") or s.get("prefill")):
                continue
            own_bytes = s.get("step_bytes", step_bytes)
            cells = []
            for b in batches:
                d = s.get("decode", {}).get(b)
                if not d:
                    cells.append("")
                    continue
                cell = f"{d['tok_s']:,.0f} ({d['ms_step']:.2f} ms)"
                if bw and own_bytes:
                    per_step = own_bytes + b * (32 + (n1 + n2) / 2) * kv
                    cell += f" {d['tok_s'] / (b * bw * 1e9 / per_step):.0%}"
                cells.append(cell)
            for k in lengths:
                p = s.get("prefill", {}).get(k)
                cells.append(f"{p['ms']:,.1f}" if p else "")
            firsts = [
                d.get("first_call_s") for d in s.get("decode", {}).values() if d.get("first_call_s")
            ]
            cells.append(f"{max(firsts):.1f}" if firsts else "")
            flag = " *" if s.get("notes") else ""
            lines.append(
                f"| {e['label']} | {name}{flag} | {s.get('weight_bytes', 0) / 1e9:.2f} | "
                + " | ".join(cells)
                + " |"
            )
        for peer in ("hf-eager", "hf-compiled", "ours-int8"):
            p = e.get(peer)
            if not p or not ours:
                continue
            cells = []
            for b in batches:
                a, c = ours.get("decode", {}).get(b), p.get("decode", {}).get(b)
                if a and c:
                    mine, theirs = (c, a) if peer == "ours-int8" else (a, c)
                    cells.append(f"B{b} {mine['tok_s'] / theirs['tok_s']:.2f}x")
            for k in lengths:
                a, c = ours.get("prefill", {}).get(k), p.get("prefill", {}).get(k)
                if a and c:
                    cells.append(f"prefill {k} {c['ms'] / a['ms']:.2f}x")
            if cells:
                what = "int8 / bf16 decode" if peer == "ours-int8" else f"ours vs {peer}"
                ratios.append(f"- {e['label']}, {what}: " + ", ".join(cells))
    lines += [
        "",
        "Ratios (decode: tokens/s over tokens/s; prefill: their time over ours):",
        *ratios,
    ]
    notes = [
        f"- {e['label']} {n}: {'; '.join(s['notes'])}"
        for e in results["shapes"].values()
        for n, s in e.items()
        if isinstance(s, dict) and s.get("notes")
    ]
    if notes:
        lines += ["", "* notes:", *notes]
    if results.get("smoke"):
        lines += ["", "Smoke (on the " + results["smoke"]["shape"] + " shape):"]
        lines += [f"- {k}: {v}" for k, v in results["smoke"].items() if k != "shape"]
    if results.get("profile"):
        lines += [
            "",
            f"Profile: {json.dumps(results['profile'].get('ms_per_step'))}, kernels/step {results['profile'].get('kernels_per_step')}",
        ]
    if results["skipped"]:
        lines += ["", "Skipped: " + "; ".join(results["skipped"])]
    if results["errors"]:
        lines += ["", "Failed: " + "; ".join(results["errors"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
