"""SIGTERM during streaming requests, on a server in a subprocess (`functional-gen serve`): what a
graceful shutdown promises (`functional_gen.serving.app.serve`: open streams get
`Limits.drain_seconds`, 5 s, to finish, then end with an error event): every stream that was
generating when the signal came completes; the others complete or end with the server's
"shutting down" error event (no dropped connection, none hangs); the process ends in bounded
time, without a traceback."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MAX_TOKENS = 24


# The server runs the default model cut to 2 of its 30 layers (`two_layer_default_model`): what is
# checked (streams drained, none cut, the process's end) holds for any weights, and its engine's
# programs compile several times faster than the whole model's.
SERVED_NAME = "smollm2-135m-two-layers"


def test_sigterm_during_eight_streams(two_layer_default_model):
    port = free_port()
    command = [sys.executable, "-m", "functional_gen.cli", "serve", "--port", str(port),
               "-m", str(two_layer_default_model), "--served-model-name", SERVED_NAME,
               "--max-slots", "4", "--max-len", "64", "--quiet"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                assert time.time() < deadline, "the server did not start"
                time.sleep(0.5)

        async def streams():
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                        timeout=60)  # fmt: skip
            started = asyncio.Event()
            count = [0]
            signalled = [False]

            async def one(i):
                """`(outcome, generating when the signal came)`: "completed" (a finish reason,
                then the stream's normal end), "shutdown" (the server's error event), "cut"
                (a stream that ended without either)."""
                outcome, generating = "cut", False
                try:
                    stream = await client.completions.create(
                        model=SERVED_NAME, prompt=f"Story number {i}:",
                        max_tokens=MAX_TOKENS, temperature=0, stream=True,
                    )  # fmt: skip
                    async for chunk in stream:
                        generating = generating or not signalled[0]
                        count[0] += 1
                        if count[0] >= 4:
                            started.set()
                        if chunk.choices and chunk.choices[0].finish_reason:
                            outcome = "completed"
                except openai.APIError as error:
                    # the SSE error event; anything else (a dropped connection) fails the test
                    assert "the server is shutting down" in str(error), error
                    outcome = "shutdown"
                return outcome, generating

            tasks = [asyncio.create_task(one(i)) for i in range(8)]
            await asyncio.wait_for(started.wait(), 120)
            signalled[0] = True
            process.send_signal(signal.SIGTERM)
            sent = time.time()
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await client.close()
            return outcomes, sent

        outcomes, sent = asyncio.run(streams())  # (a stream that hangs times out there)
        assert all(o in ("completed", "shutdown") for o, _ in outcomes), outcomes
        # MAX_TOKENS decode steps take well under the 5 s of the drain, even on a loaded CPU
        assert any(generating for _, generating in outcomes), outcomes
        assert all(o == "completed" for o, generating in outcomes if generating), outcomes
        # after the drain, uvicorn (0.29 on) raises the SIGTERM it caught again, so the process
        # ends by that signal (an abrupt end by it would have cut the streams above)
        status = process.wait(timeout=30)
        log = process.stdout.read().decode()
        assert status in (0, -signal.SIGTERM), log[-2000:]
        assert "Traceback" not in log, log[-2000:]
        assert time.time() - sent < 30
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
