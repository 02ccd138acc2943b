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

import fnmatch
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DEFAULT_RULES: tuple[tuple[str, P], ...] = (
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


def make_mesh(data: int = 1, model: int | None = None) -> Mesh:
    """A `("data", "model")` mesh over the available devices, with Auto axis types (GSPMD).

    **Arguments:** `data`, `model`: axis sizes (`model` defaults to the devices left).

    **Raises:** `ValueError` if `data * model` differs from the number of devices.
    """
    n = len(jax.devices())
    model = n // data if model is None else model
    if data * model != n:
        raise ValueError(f"a mesh of {data} x {model} needs {data * model} devices; there are {n}")
    from jax.sharding import AxisType

    return jax.make_mesh((data, model), MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def partition_spec(name: str, shape: tuple[int, ...], mesh: Mesh, rules=None) -> P:
    """The `PartitionSpec` of weight `name` (dotted Hugging Face name) of `shape` on `mesh`.

    **Raises:** `ValueError` when the chosen spec does not divide the weight's shape evenly
    (naming the weight, its shape and the mesh), or names an axis the mesh lacks.
    """
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


def shard(model, mesh: Mesh, rules: Mapping[str, P] | None = None):
    """Place the weights of `model` on `mesh` (a `("data", "model")` mesh), tensor-parallel over
    `"model"` (see the module docstring); returns the sharded model.

    **Arguments:** `model`: an Equinox model whose leaves are named like Hugging Face weights
    (`LlamaForCausalLM`); `mesh`; `rules`: glob pattern -> `PartitionSpec`, tried before the
    defaults.

    **Raises:** `ValueError` for a mesh without the axes `("data", "model")` or a weight that a
    rule cannot split evenly.
    """
    if tuple(mesh.axis_names) != MESH_AXES:
        raise ValueError(f"the mesh must have axes {MESH_AXES}, got {tuple(mesh.axis_names)}")

    def place(path, leaf):
        if not isinstance(leaf, (jax.Array, np.ndarray)):
            return leaf
        name = _name(path)
        spec = partition_spec(name, tuple(leaf.shape), mesh, rules)
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(place, model)


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
        if leaf.ndim and leaf.shape[0] % data == 0 and data > 1:
            spec = P("data")
        else:
            spec = P()
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    return jax.tree.map(place, tree)


def replicate(tree, mesh: Mesh):
    """Put every array of `tree` on every device of `mesh` (processors, constraint tables)."""
    return jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P()))
        if isinstance(x, (jax.Array, np.ndarray))
        else x,
        tree,
    )


def _name(path) -> str:
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        else:
            parts.append(str(entry))
    return ".".join(parts)
