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

from . import models as models, processors as processors, samplers as samplers
from .cache import enable_compilation_cache as enable_compilation_cache
from .generation import (
    GenerationResult as GenerationResult,
    bucket_length as bucket_length,
    generate as generate,
    generate_token_ids as generate_token_ids,
    init_state as init_state,
)
from .loading import load_model as load_model
from .models import KVCache as KVCache, LlamaConfig as LlamaConfig, LlamaForCausalLM as LlamaForCausalLM
from .state import FINISH_REASONS as FINISH_REASONS, GenerationState as GenerationState
from .step import Step as Step, make_step as make_step
from .streaming import stream as stream

__version__ = "0.1.0"
