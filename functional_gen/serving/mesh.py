"""The serving engine on a `("data", "model")` mesh: where each array of its decode state lives,
and the wrapper that compiles every engine program with that layout on its outputs.

**Layout** (`decode_state_specs`), the one `fg.generate` and `sharding.plan` give a sharded
model's generation state: every array of the decode state has the slot axis first and is split
over `"data"` along it (slots over data-parallel replicas; replicated when the slot count does
not divide, e.g. a narrower decode width); the keys and values of the lockstep `KVCache`
(`[slots, *branch, kv_heads, kv_seq, head_dim]`) are split over `"model"` along `kv_heads` as
well, when the heads divide (Megatron-style tensor parallelism keeps each device's heads' keys
beside its slice of `k_proj`/`v_proj`; else they are replicated over `"model"`, as vLLM
replicates key/value heads when the tensor-parallel size exceeds them). The paged pools
(`[kv_heads, blocks, block_size, head_dim]`, `serving.paged`) are shared by every slot: split
over `"model"` by heads, replicated over `"data"`.

**Programs** (`program`): each engine program is one `eqx.filter_jit`, GSPMD partitions it (no
`shard_map`). A program whose inputs are on a mesh constrains every decode state it returns to
the layout above (`jax.lax.with_sharding_constraint`), so the state it returns has exactly the
shardings of the state it was given: the next program takes it without a copy, compiles once,
and the donated input buffers are reused for the output (XLA aliases a donated buffer only
into an output of the same sharding).
"""

import functools

import equinox as eqx
import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from ..models.base import AbstractCausalLM
from ..sharding import _put, mesh_of, shard
from ..speculative.proposers import DraftModel


def _axis(mesh: Mesh | AbstractMesh, name: str, size: int) -> str | None:
    """`name` when the mesh axis `name` has more than one device and divides `size`, else
    `None` (replicated along that dimension)."""
    n = mesh.shape[name]
    return name if n > 1 and size % n == 0 else None


def check_engine_mesh(mesh: Mesh | AbstractMesh, model, max_slots: int, speculative=None) -> None:
    """Refuse an engine layout that does not fit `mesh` (a `Mesh`, or an `AbstractMesh`: only
    its axis sizes are read), before anything is placed or compiled.

    **Raises:** `ValueError` naming the value: `max_slots` not divisible by the `"data"` axis
    (each data-parallel replica decodes `max_slots / data` slots, as vLLM's
    `--data-parallel-size` splits its batch); a model whose `num_attention_heads` the `"model"`
    axis does not divide (each tensor-parallel device computes whole heads, vLLM's rule); the
    same for the draft model of a `speculative` `DraftModel` (it is split over `"model"` as the
    target is).
    """
    data, tensor = mesh.shape["data"], mesh.shape["model"]
    if max_slots % data:
        raise ValueError(
            f"`max_slots`={max_slots} is not divisible by the mesh's data axis ({data}): each "
            "data-parallel replica decodes the same number of slots"
        )
    models = [("model", model)]
    if isinstance(speculative, DraftModel):
        models.append(("draft model", speculative.draft))
    for name, each in models:
        config = getattr(each, "config", None)
        heads = getattr(config, "num_attention_heads", None)
        if heads is not None and heads % tensor:
            raise ValueError(
                f"the {name}'s num_attention_heads={heads} is not divisible by the mesh's model "
                f"axis ({tensor}): tensor parallelism splits whole attention heads"
            )


def place_proposer(speculative, mesh: Mesh):
    """`speculative` with a `DraftModel`'s draft placed on `mesh` as the target is (`fg.shard`:
    tensor parallel over `"model"`), unless it is already there; any other proposer (or `None`)
    as it is (`PromptLookup` has no weights, `EarlyExit` runs the target's own layers)."""
    if isinstance(speculative, DraftModel) and mesh_of(speculative.draft) != mesh:
        return eqx.tree_at(lambda p: p.draft, speculative, shard(speculative.draft, mesh))
    return speculative


def decode_state_specs(state, mesh: Mesh | AbstractMesh):
    """The `PartitionSpec` of every array of `state` (a `DecodeState` or `PagedDecodeState`, or
    any pytree whose arrays have the slot axis first) on `mesh` (a `Mesh`, or an `AbstractMesh`:
    only its axis sizes are read), as a pytree of the same
    structure (see the module docstring). Non-array leaves map to `None`."""

    def spec(path, leaf):
        if not hasattr(leaf, "shape"):
            return None
        if leaf.size == 0:  # nothing to split (`top_logprobs=0`); XLA replicates it anyway
            return P()
        names = [getattr(p, "name", None) for p in path]
        parent = names[-2] if len(names) > 1 else None  # k / v: a tuple of layers
        shape = tuple(leaf.shape)
        if "paged" in names and parent in ("k", "v") and len(shape) == 4:
            return P(_axis(mesh, "model", shape[0]))  # pools, shared by every slot
        rows = _axis(mesh, "data", shape[0]) if shape else None
        if "cache" in names and parent in ("k", "v") and len(shape) >= 4:
            heads = _axis(mesh, "model", shape[-3])
            return P(rows, *(None,) * (len(shape) - 4), heads)
        return P(rows) if rows else P()

    return jax.tree_util.tree_map_with_path(spec, state)


def place_decode_state(state, mesh: Mesh):
    """`state` with every array put on `mesh` in the layout of `decode_state_specs` (through host
    memory, `sharding._put`, so PRNG keys go as key data)."""
    specs = decode_state_specs(state, mesh)
    return jax.tree.map(
        lambda x, s: x if s is None else _put(x, NamedSharding(mesh, s)),
        state,
        specs,
        is_leaf=lambda x: x is None,
    )


def constrain_decode_state(state, mesh: Mesh):
    """Inside a jitted program: `state` constrained to the layout of `decode_state_specs`."""
    specs = decode_state_specs(state, mesh)
    return jax.tree.map(
        lambda x, s: (
            x if s is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))
        ),
        state,
        specs,
        is_leaf=lambda x: x is None,
    )


def program(fn, *, donate: str = "none", state_type: type):
    """`fn` jitted (`eqx.filter_jit(..., donate=donate)`), and on a mesh every `state_type`
    (the engine's `DecodeState`) in its output constrained to the decode-state layout
    (`constrain_decode_state`). The mesh is that of the first array of the arguments placed on
    one (`sharding.mesh_of`: the sharded model or the placed decode state), passed to the
    compiled program as a static argument; `None` (one device) leaves `fn` as it is.

    When the first argument is a model (`AbstractCausalLM`, or a tuple that starts with one: the
    speculative dispatch's `(model, speculation)`), the program is compiled with its
    per-program XLA options (`compiler_options`, from its `ExecutionPlan`: the GPU plan's
    command buffers for `while` and conditionals, so that a decode dispatch's loop runs as CUDA
    graphs, as `fg.generate`'s program does): one jitted function per distinct set of options,
    kept in `call.programs` (options -> jitted function)."""

    def constrained(*args, mesh=None):
        out = fn(*args)
        if mesh is None:
            return out
        is_state = lambda x: isinstance(x, state_type)  # noqa: E731
        return jax.tree.map(
            lambda x: constrain_decode_state(x, mesh) if is_state(x) else x, out, is_leaf=is_state
        )

    programs: dict[tuple[tuple[str, str], ...], object] = {}

    @functools.wraps(fn)
    def call(*args):
        first = args[0] if args else None
        if isinstance(first, tuple) and first:
            first = first[0]
        options = first.compiler_options if isinstance(first, AbstractCausalLM) else ()
        jitted = programs.get(options)
        if jitted is None:
            extra = {"compiler_options": dict(options)} if options else {}
            jitted = programs[options] = eqx.filter_jit(constrained, donate=donate, **extra)
        return jitted(*args, mesh=mesh_of(args))

    call.programs = programs
    return call
