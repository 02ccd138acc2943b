"""SIGTERM during streaming requests, on a server in a subprocess (`functional-gen serve`): each
stream completes or ends with an error event, none hangs, and the process exits in bounded
time."""

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


def test_sigterm_during_eight_streams(default_model):
    del default_model  # converted once for the session: the subprocess finds it in the cache
    port = free_port()
    command = [sys.executable, "-m", "functional_gen.cli", "serve", "--port", str(port),
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

            async def one(i):
                outcome = "hung"
                try:
                    stream = await client.completions.create(
                        model="SmolLM2-135M-Instruct", prompt=f"Story number {i}:",
                        max_tokens=40, temperature=0, stream=True,
                    )  # fmt: skip
                    async for chunk in stream:
                        count[0] += 1
                        if count[0] >= 4:
                            started.set()
                        if chunk.choices and chunk.choices[0].finish_reason:
                            outcome = "completed"
                except openai.APIError:
                    outcome = "error"
                return outcome

            tasks = [asyncio.create_task(one(i)) for i in range(8)]
            await asyncio.wait_for(started.wait(), 120)
            process.send_signal(signal.SIGTERM)
            sent = time.time()
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await client.close()
            return outcomes, sent

        outcomes, sent = asyncio.run(streams())
        assert all(o in ("completed", "error") for o in outcomes), outcomes
        process.wait(timeout=30)
        assert time.time() - sent < 30
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
