"""Generation across processes: two local processes (CPU, 4 devices each, the loopback address)
with `jax.distributed` generate the same tokens as one process (the default model cut to 2 of
its 30 layers, `two_layer_default_model`: the collectives are per layer)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=sys.argv[2], num_processes=2, process_id=int(sys.argv[1])
    )
    import numpy as np
    import functional_gen as fg

    model, tok = fg.load_model(sys.argv[4])
    sharded = fg.shard(model, fg.make_mesh(2, 4))  # 8 devices over 2 processes
    prompts = json.loads(sys.argv[3])
    out = fg.generate(sharded, tok, prompts, max_new_tokens=8, sampler=fg.samplers.Greedy())
    print(json.dumps(np.asarray(out.token_ids).tolist()))
    """
)

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "Hello there"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_generate_what_one_does(two_layer_default_model):
    import numpy as np

    import functional_gen as fg

    model, tokenizer = fg.load_model(two_layer_default_model)
    expected = np.asarray(
        fg.generate(
            model, tokenizer, PROMPTS, max_new_tokens=8, sampler=fg.samplers.Greedy()
        ).token_ids
    ).tolist()
    address = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(i),
                address,
                json.dumps(PROMPTS),
                str(two_layer_default_model),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=900)
            assert p.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert outputs[0] == outputs[1] == expected
