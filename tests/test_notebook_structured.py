"""The structured-generation notebook runs top to bottom as a plain script (so it cannot rot)."""

import runpy
import time
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "structured_generation.py"


@pytest.mark.slow
def test_structured_generation_notebook_runs():
    start = time.perf_counter()
    namespace = runpy.run_path(str(NOTEBOOK), run_name="__main__")
    elapsed = time.perf_counter() - start
    assert namespace["document"]["age"] >= 0  # the last cell's checks ran
    assert elapsed < 240, f"the notebook took {elapsed:.0f} s; keep it under 2 minutes"
