"""Speculative decoding's proposers: who guesses the tokens the model then verifies.

```python
fg.generate(..., speculative=fg.speculative.PromptLookup(num_tokens=10, max_ngram_size=3))
fg.generate(..., speculative=fg.speculative.DraftModel(draft_model, num_tokens=4))
fg.generate(..., speculative=fg.speculative.EarlyExit(num_layers=8, num_tokens=4))
```

The search that verifies the guesses is `functional_gen.generation.speculative.Speculative`;
the acceptance rule is in `acceptance`, the cache rollback by positions in `cache`.
"""

from .acceptance import (
    accepted_count as accepted_count,
    exact_match as exact_match,
    rejection_sample as rejection_sample,
    residual as residual,
)
from .proposers import (
    AbstractProposer as AbstractProposer,
    DraftModel as DraftModel,
    EarlyExit as EarlyExit,
    PromptLookup as PromptLookup,
)
