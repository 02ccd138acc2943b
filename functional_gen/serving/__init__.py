"""Serving: a continuous-batching `Engine` (prefill / insert / generate over fixed slots), its
asyncio orchestrator (`Engine.stream`), and an OpenAI-compatible HTTP server
(`functional_gen.serving.app`, imported only by `functional-gen serve`: it needs the `serve`
extra, FastAPI and uvicorn, which `import functional_gen` must not load).

This package sits above `functional_gen.generation`; nothing below imports it.
"""

from .engine import Engine as Engine
from .engine import Prefix as Prefix
from .engine import Request as Request
