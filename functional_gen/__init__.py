"""functional_gen: pure-functional text generation for JAX.

Load a decoder-only language model into Equinox modules and generate text with it; every piece
of generation state (KV cache, logits-processor states, PRNG keys, sequences, finished flags) is
an explicit pytree carried by one pure, jitted step.

```python
import jax, functional_gen as fg

model, tokenizer = fg.load_model()  # SmolLM2-135M-Instruct
result = fg.generate(model, tokenizer, ["Once upon a time"], max_new_tokens=32,
                     processors=[fg.processors.Temperature(0.7), fg.processors.TopP(0.9)],
                     sampler=fg.samplers.Multinomial(), key=jax.random.key(0))
```
"""

# first, before the heavy imports: Ctrl-C while the `functional-gen` program starts is one line
from . import program_start  # noqa: F401  # isort: skip  (its import installs the handler)
from . import models as models, processors as processors, speculative as speculative
from .cache import enable_compilation_cache as enable_compilation_cache
from .generation import (
    FINISH_REASONS as FINISH_REASONS,
    BatchMismatchError as BatchMismatchError,
    GenerationOptions as GenerationOptions,
    GenerationResult as GenerationResult,
    GenerationState as GenerationState,
    ModelMismatchError as ModelMismatchError,
    SequenceState as SequenceState,
    SequenceStateFormatError as SequenceStateFormatError,
    Step as Step,
    Stream as Stream,
    TokenizerMismatchError as TokenizerMismatchError,
    bucket_length as bucket_length,
    generate as generate,
    generate_token_ids as generate_token_ids,
    init_state as init_state,
    make_step as make_step,
    samplers as samplers,
    stream as stream,
)
from .loading import load_model as load_model
from .sharding import make_mesh as make_mesh, shard as shard
from . import serving as serving  # the engine only: the HTTP app (FastAPI) is not imported
from .models import (
    AbstractCausalLM as AbstractCausalLM,
    KVCache as KVCache,
    LlamaConfig as LlamaConfig,
    LlamaForCausalLM as LlamaForCausalLM,
)

import sys as _sys

# `functional_gen.samplers` keeps working as a module path (it lives in `generation/` now).
_sys.modules[__name__ + ".samplers"] = samplers

__version__ = "0.1.0"
