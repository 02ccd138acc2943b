"""Execute the notebooks into docs/tutorials/ and build the documentation site.

    .venv/bin/python scripts/build_docs.py [--serve]

The notebooks in `notebooks/` are jupytext "percent" scripts; each is executed with nbclient
(so the pages show real outputs and plots) and written as `docs/tutorials/<name>.ipynb`, then
`mkdocs build --strict` builds `site/`.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def execute_notebook(source: Path, target: Path, timeout: int = 600) -> float:
    """Execute the jupytext notebook `source` and write the executed `.ipynb` to `target`.

    **Returns:** the execution time in seconds. **Raises:** `nbclient.exceptions.CellExecutionError`
    when a cell fails.
    """
    import jupytext
    import nbclient
    import nbformat

    notebook = jupytext.read(source)
    start = time.perf_counter()
    nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    ).execute()
    elapsed = time.perf_counter() - start
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return elapsed


def notebooks() -> list[Path]:
    """The tutorial notebooks, `notebooks/*.py`."""
    return sorted((ROOT / "notebooks").glob("*.py"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="run `mkdocs serve` afterwards")
    args = parser.parse_args(argv)
    for source in notebooks():
        elapsed = execute_notebook(source, ROOT / "docs" / "tutorials" / f"{source.stem}.ipynb")
        print(f"executed {source.name} in {elapsed:.0f} s")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=ROOT, check=True)
    if args.serve:
        subprocess.run([sys.executable, "-m", "mkdocs", "serve"], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
