"""Meshes and partition rules: tensor- and data-parallel generation with `jax.sharding`.

The compiler's own distributed engine does the work (GSPMD): we place the weights on a
`jax.sharding.Mesh` with axes `("data", "model")` and the per-row generation state over
`"data"`, and XLA partitions the compiled loop, inserting the collectives. There is no
`shard_map` of our own.

Layout (Megatron-style tensor parallelism over `"model"`, Shoeybi et al. 2019, "Megatron-LM"):
q/k/v/gate/up projections split by output features, o/down by input features (so each pair
needs one all-reduce), the embedding and the output head by vocabulary, norms replicated.
Users pass `rules` (glob patterns over the Hugging Face weight names -> `PartitionSpec`) for
another layout; the first matching pattern wins, theirs before ours.

Use `jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2)`: JAX 0.10's
default axis type is Explicit, under which sharded contractions need annotations everywhere.
"""

import dataclasses
import fnmatch
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from .models.decoder import DecoderForCausalLM
from .models.kv_cache import KVCache
from .models.weight_tree import path_name

DEFAULT_RULES: tuple[tuple[str, P], ...] = (
    # the decoder's fused modules (`functional_gen.models.families.fused`): by output rows
    ("*.self_attn.qkv_proj.weight", P("model", None)),
    ("*.self_attn.qkv_proj.bias", P("model")),
    ("*.mlp.gate_up_proj.weight", P("model", None)),
    ("*.mlp.gate_up_proj.bias", P("model")),
    # the separate projections' names, for models that keep them
    ("*.self_attn.q_proj.weight", P("model", None)),
    ("*.self_attn.k_proj.weight", P("model", None)),
    ("*.self_attn.v_proj.weight", P("model", None)),
    ("*.self_attn.q_proj.bias", P("model")),
    ("*.self_attn.k_proj.bias", P("model")),
    ("*.self_attn.v_proj.bias", P("model")),
    ("*.self_attn.o_proj.weight", P(None, "model")),
    ("*.mlp.gate_proj.weight", P("model", None)),
    ("*.mlp.up_proj.weight", P("model", None)),
    ("*.mlp.gate_proj.bias", P("model")),
    ("*.mlp.up_proj.bias", P("model")),
    ("*.mlp.down_proj.weight", P(None, "model")),
    ("model.embed_tokens.weight", P("model", None)),
    ("lm_head.weight", P("model", None)),
)
"""Megatron-style tensor parallelism over the `"model"` axis; anything unlisted is replicated."""

MESH_AXES = ("data", "model")


def make_mesh(data=1, model=None, *, devices=None) -> Mesh:
    """A `("data", "model")` mesh over the available devices, with Auto axis types (GSPMD).

    **Arguments:** `data`, `model`: axis sizes, positive integers (Python or numpy; `model`
    defaults to the devices left). Not annotated on purpose: they are checked here, with an
    error that names them (an annotation would let a runtime type checker answer first).
    `devices`: keyword-only, the devices to lay out (default: all of `jax.devices()`).

    **Raises:** `TypeError` naming `data` or `model` when it is not an integer (a bool, a float,
    a string); `ValueError` naming it when it is zero or negative, or when `data * model`
    differs from the number of devices.
    """
    _check_axis_size("data", data)
    if model is not None:
        _check_axis_size("model", model)
    devices = jax.devices() if devices is None else list(devices)
    n = len(devices)
    if model is None and n % data:
        raise ValueError(f"data={data} does not divide the {n} devices; pass model= too")
    model = n // data if model is None else model
    if data * model != n:
        raise ValueError(f"a mesh of {data} x {model} needs {data * model} devices; there are {n}")
    from jax.sharding import AxisType

    return jax.make_mesh((data, model), MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def _check_axis_size(name: str, size) -> None:
    """Refuse a mesh axis size that is not a positive integer, naming the argument."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"make_mesh: `{name}` must be a positive integer, got {size!r}")
    if size < 1:
        raise ValueError(f"make_mesh: `{name}` must be a positive integer, got {size!r}")


def check_mesh(mesh) -> None:
    """Refuse anything but a `jax.sharding.Mesh` with the axes `("data", "model")`.

    **Raises:** `TypeError` naming `mesh` for a value that is not a `Mesh` (e.g. the string
    `"cpu"`: build one with `functional_gen.make_mesh`); `ValueError` naming `mesh` for a mesh
    with other axes.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"`mesh` must be a jax.sharding.Mesh with axes {MESH_AXES} (build one with "
            f"functional_gen.make_mesh(data, model)), got {type(mesh).__name__} {mesh!r:.80}"
        )
    if tuple(mesh.axis_names) != MESH_AXES:
        raise ValueError(f"the `mesh` must have axes {MESH_AXES}, got {tuple(mesh.axis_names)}")


def check_rules(rules) -> None:
    """Refuse `rules` that are not a mapping of glob patterns (`str`) to `PartitionSpec`s.

    **Raises:** `TypeError` naming `rules` and the offending pattern or value (a tuple or a
    string where a `PartitionSpec` belongs, a non-string pattern, a list of pairs).
    """
    if rules is None:
        return
    if not isinstance(rules, Mapping):
        raise TypeError(
            "`rules` must be a mapping of glob patterns to jax.sharding.PartitionSpec, got "
            f"{type(rules).__name__} {rules!r:.80}"
        )
    for pattern, spec in rules.items():
        if not isinstance(pattern, str):
            raise TypeError(f"`rules` keys must be glob patterns (str), got {pattern!r}")
        if not isinstance(spec, P):
            raise TypeError(
                f"`rules[{pattern!r}]` must be a jax.sharding.PartitionSpec, e.g. "
                f"PartitionSpec('model', None), got {type(spec).__name__} {spec!r:.80}"
            )


def partition_spec(name: str, shape: tuple[int, ...], mesh: Mesh, rules=None) -> P:
    """The `PartitionSpec` of weight `name` (dotted Hugging Face name) of `shape` on `mesh`.

    **Raises:** `ValueError` when the chosen spec does not divide the weight's shape evenly
    (naming the weight, its shape and the mesh), or names an axis the mesh lacks; `TypeError`
    for `rules` that are not a mapping of patterns to `PartitionSpec`s (`check_rules`).
    """
    check_rules(rules)
    rules = tuple((rules or {}).items()) + DEFAULT_RULES
    spec = next((s for pattern, s in rules if fnmatch.fnmatchcase(name, pattern)), P())
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if axis is None:
            continue
        axes = axis if isinstance(axis, tuple) else (axis,)
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
            raise ValueError(f"the rule for {name!r} names mesh axes {missing} the mesh lacks")
        size = int(np.prod([mesh.shape[a] for a in axes]))
        if dim % size:
            raise ValueError(
                f"{name!r} of shape {shape} cannot be split {spec} over the mesh {dict(mesh.shape)}: "
                f"{dim} is not divisible by {size}; pass rules={{{name!r}: PartitionSpec()}} to "
                "replicate it"
            )
    return spec


def shard(model, mesh, rules=None):
    """Place the weights of `model` on `mesh` (a `("data", "model")` mesh), tensor-parallel over
    `"model"` (see the module docstring); returns the sharded model.

    **Arguments:** `model`: an Equinox model whose leaves are named like Hugging Face weights
    (`LlamaForCausalLM`); `mesh`: a `jax.sharding.Mesh` (`make_mesh`); `rules`: a mapping of
    glob pattern -> `PartitionSpec`, tried before the defaults. `mesh` and `rules` are not
    annotated: `check_mesh` / `check_rules` check them with errors that name them.

    **Raises:** `TypeError` naming `mesh` for a value that is not a `jax.sharding.Mesh` (e.g.
    `"cpu"`), naming `rules` for rules that are not a mapping of patterns to `PartitionSpec`s;
    `ValueError` for a mesh without the axes `("data", "model")` or a weight that a rule cannot
    split evenly. All are raised before anything is placed or compiled.
    """
    check_mesh(mesh)
    check_rules(rules)

    def place(path, leaf):
        if not isinstance(leaf, (jax.Array, np.ndarray)):
            return leaf
        name = path_name(path)
        spec = partition_spec(name, tuple(leaf.shape), mesh, rules)
        return _put(leaf, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(place, model)


def _put(leaf, sharding):
    """`device_put` through host memory, so that it also works across processes (every process
    holds the same host value and places its own shards). PRNG key arrays go as key data."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(leaf)
        data = _put(jax.random.key_data(leaf), sharding)
        return jax.random.wrap_key_data(data, impl=impl)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return jax.device_put(leaf, sharding)
    return jax.device_put(np.asarray(leaf), sharding)


def to_host(tree):
    """`jax.device_get` that also gathers arrays spread over several processes (multi-host)."""
    from jax.experimental import multihost_utils

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(get, tree)


def mesh_of(tree) -> Mesh | None:
    """The mesh the arrays of `tree` are placed on (the first `NamedSharding` found), or `None`."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def place_rows(tree, mesh: Mesh):
    """Put every array of `tree` on `mesh`: split over `"data"` along its leading (batch) axis
    when that axis divides evenly, else replicated."""
    data = mesh.shape["data"]

    def place(leaf):
        if not isinstance(leaf, (jax.Array, np.ndarray)):
            return leaf
        spec = P("data") if leaf.ndim and leaf.shape[0] % data == 0 and data > 1 else P()
        return _put(leaf, NamedSharding(mesh, spec))

    return jax.tree.map(place, tree)


def replicate(tree, mesh: Mesh):
    """Put every array of `tree` on every device of `mesh` (processors, constraint tables)."""
    return jax.tree.map(
        lambda x: (
            _put(x, NamedSharding(mesh, P())) if isinstance(x, (jax.Array, np.ndarray)) else x
        ),
        tree,
    )


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def plan(config, mesh_shape: tuple[int, int], batch: int, max_len: int, dtype="bfloat16") -> dict:
    """Compile one decode step of a model of `config` on a `mesh_shape` mesh without allocating
    any weight (abstract arrays, `jax.ShapeDtypeStruct`), and report what it needs per device.

    The weights are laid out as `shard` would (`DEFAULT_RULES`), the KV cache split over
    `"data"` (rows) and `"model"` (key/value heads, when they divide), the new tokens over
    `"data"`. Needs `mesh_shape[0] * mesh_shape[1]` devices (on a CPU, start the process with
    `XLA_FLAGS=--xla_force_host_platform_device_count=N`).

    **Arguments:** `config` (a `LlamaConfig`), `mesh_shape` `(data, model)`, `batch` (rows),
    `max_len` (cache slots per row), `dtype` of weights and cache.

    **Returns:** a dict: `weights_bytes` and `cache_bytes` per device (analytic, from the
    shardings and `KVCache.init`'s layout: sliding-window layers in rings), `argument_bytes`, `output_bytes`, `temp_bytes` and `generated_code_bytes` per
    device (XLA's `compiled.memory_analysis()`), and `collectives`: the count of each collective
    op in the compiled HLO of one step.

    **Raises:** `ValueError` when there are fewer devices than the mesh needs, or a weight does
    not split evenly.
    """
    data, model_axis = mesh_shape
    devices = jax.devices()
    if data * model_axis > len(devices):
        raise ValueError(
            f"a {data} x {model_axis} mesh needs {data * model_axis} devices, this process has "
            f"{len(devices)} (set XLA_FLAGS=--xla_force_host_platform_device_count=N on a CPU)"
        )
    mesh = jax.make_mesh(
        mesh_shape,
        MESH_AXES,
        axis_types=(AxisType.Auto,) * 2,
        devices=devices[: data * model_axis],
    )
    dtype = jnp.dtype(dtype)
    skeleton = eqx.filter_eval_shape(DecoderForCausalLM, config, key=jax.random.key(0), dtype=dtype)
    is_struct = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731

    def annotate(path, leaf):
        if not is_struct(leaf):
            return leaf
        spec = partition_spec(path_name(path), tuple(leaf.shape), mesh)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    abstract = jax.tree_util.tree_map_with_path(annotate, skeleton, is_leaf=is_struct)
    params, static = eqx.partition(abstract, is_struct, is_leaf=is_struct)
    heads = P("data", "model") if config.num_key_value_heads % model_axis == 0 else P("data")
    kv = NamedSharding(mesh, heads)
    rows = NamedSharding(mesh, P("data"))
    # the layout of `KVCache.init` (sliding-window layers in rings), with shardings attached
    cache = jax.eval_shape(lambda: KVCache.init(config, batch, max_len, dtype))

    def placed(x, sharding):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    cache = dataclasses.replace(
        cache,
        k=tuple(placed(x, kv) for x in cache.k),
        v=tuple(placed(x, kv) for x in cache.v),
        positions=placed(cache.positions, rows),
        length=placed(cache.length, rows),
        ring_positions=None if cache.ring_positions is None else placed(cache.ring_positions, rows),
    )
    tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=rows)

    def decode(params, token_ids, positions, cache):
        return eqx.combine(params, static)(token_ids, positions, cache)

    compiled = jax.jit(decode, donate_argnums=3).lower(params, tokens, tokens, cache).compile()
    memory = compiled.memory_analysis()
    hlo = compiled.as_text()

    def per_device(structs):
        total = 0
        for s in jax.tree.leaves(structs, is_leaf=is_struct):
            shard = s.sharding.shard_shape(s.shape)
            total += int(np.prod(shard)) * s.dtype.itemsize
        return total

    return {
        "mesh": (data, model_axis),
        "weights_bytes": per_device(params),
        "cache_bytes": per_device((cache.k, cache.v)),
        "argument_bytes": int(memory.argument_size_in_bytes),
        "output_bytes": int(memory.output_size_in_bytes),
        "temp_bytes": int(memory.temp_size_in_bytes),
        "generated_code_bytes": int(memory.generated_code_size_in_bytes),
        "collectives": {
            op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in COLLECTIVES
        },
    }
