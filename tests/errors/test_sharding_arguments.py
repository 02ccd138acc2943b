"""Bad arguments of `fg.make_mesh`, `fg.shard` and `fg.load_model(mesh=...)` are refused by
name, before anything is placed on a device or compiled (issue 43, item 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import functional_gen as fg
from functional_gen.sharding import partition_spec

from .compilations import count_compilations


def tiny_model():
    """A stand-in model: one weight named like a Hugging Face key."""
    return {"model": {"embed_tokens": {"weight": np.zeros((8, 4), np.float32)}}}


@pytest.mark.parametrize("data", [0, -1, -8])
def test_make_mesh_refuses_non_positive_data(data):
    with count_compilations() as compiled, pytest.raises(ValueError, match=rf"`data`.*{data}"):
        fg.make_mesh(data)
    assert compiled == []


@pytest.mark.parametrize("model", [0, -2])
def test_make_mesh_refuses_non_positive_model(model):
    with pytest.raises(ValueError, match=rf"`model`.*{model}"):
        fg.make_mesh(1, model)


@pytest.mark.parametrize("value", [1.5, "2", True])
def test_make_mesh_refuses_non_integers(value):
    with pytest.raises(TypeError, match=r"`data`"):
        fg.make_mesh(value)
    with pytest.raises(TypeError, match=r"`model`"):
        fg.make_mesh(1, value)


def test_make_mesh_still_builds_the_one_device_mesh():
    mesh = fg.make_mesh()
    assert dict(mesh.shape) == {"data": 1, "model": len(jax.devices())}
    assert fg.make_mesh(np.int64(1), len(jax.devices())).axis_names == ("data", "model")


@pytest.mark.parametrize("mesh", ["cpu", None, jax.devices()[0], ("data", "model")])
def test_shard_refuses_a_mesh_that_is_not_a_mesh(mesh):
    with count_compilations() as compiled, pytest.raises(TypeError, match=r"`mesh`") as err:
        fg.shard(tiny_model(), mesh)
    assert type(mesh).__name__ in str(err.value)
    assert compiled == []


def test_shard_refuses_a_mesh_with_other_axes():
    mesh = jax.make_mesh((1,), ("x",))
    with pytest.raises(ValueError, match=r"`mesh`.*\('x',\)"):
        fg.shard(tiny_model(), mesh)


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        ({"*.embed_tokens.weight": ("model", None)}, r"rules\['\*\.embed_tokens\.weight'\]"),
        ({"*.embed_tokens.weight": "model"}, r"rules\['\*\.embed_tokens\.weight'\].*'model'"),
        ({"*.embed_tokens.weight": None}, r"rules\['\*\.embed_tokens\.weight'\].*NoneType"),
        ({3: P()}, r"`rules` keys.*3"),
        ([("*.embed_tokens.weight", P())], r"`rules` must be a mapping.*list"),
        ("model", r"`rules` must be a mapping.*str"),
    ],
)
def test_shard_refuses_rules_that_are_not_partition_specs(rules, named):
    mesh = fg.make_mesh()
    before = tiny_model()["model"]["embed_tokens"]["weight"]
    with count_compilations() as compiled, pytest.raises(TypeError, match=named):
        fg.shard(tiny_model(), mesh, rules)
    assert compiled == []
    with pytest.raises(TypeError, match=named):
        partition_spec("model.embed_tokens.weight", before.shape, mesh, rules)


def test_shard_with_good_rules_still_places_the_weights():
    mesh = fg.make_mesh()
    out = fg.shard(tiny_model(), mesh, {"*.embed_tokens.weight": P(None, "model")})
    w = out["model"]["embed_tokens"]["weight"]
    assert isinstance(w, jax.Array)
    assert w.sharding.spec == P(None, "model")
    np.testing.assert_array_equal(np.asarray(w), np.zeros((8, 4)))


def test_load_model_refuses_a_bad_mesh_before_reading_anything(tmp_path):
    # the directory is empty: a mesh check that ran after reading would raise FileNotFoundError
    with pytest.raises(TypeError, match=r"`mesh`.*str"):
        fg.load_model(tmp_path, mesh="cpu")
    with pytest.raises(TypeError, match=r"rules\['\*'\]"):
        fg.load_model(tmp_path, mesh=fg.make_mesh(), rules={"*": "model"})


def test_jnp_arrays_pass_the_rules_check():
    # a jnp array is a leaf like a numpy one
    out = fg.shard({"lm_head": {"weight": jnp.ones((4, 2))}}, fg.make_mesh())
    assert out["lm_head"]["weight"].shape == (4, 2)


def test_the_compilation_counter_sees_a_compilation():
    """The `compiled == []` checks above can fail: a fresh jitted function is counted."""
    with count_compilations() as compiled:
        jax.jit(lambda x: x * 3 + 1)(jnp.ones(5))
    assert "/jax/core/compile/backend_compile_duration" in compiled
