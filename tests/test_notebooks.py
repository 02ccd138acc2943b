"""Every notebook runs top to bottom (so the tutorials cannot rot), and the docs build strictly
with the executed notebooks in them."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
build_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_docs)

pytest.importorskip("nbclient")
pytest.importorskip("jupytext")

NOTEBOOKS = build_docs.notebooks()


@pytest.fixture(scope="session")
def executed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("executed-notebooks")


@pytest.mark.slow
@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(source, executed_dir, record_property):
    import nbformat

    target = executed_dir / f"{source.stem}.ipynb"
    elapsed = build_docs.execute_notebook(source, target)
    notebook = nbformat.read(target, as_version=4)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert outputs, "the notebook produced no output"
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook draws no figure"
    # Its time is reported, not asserted (speed lives in benchmarks; a loaded machine took 290 s for
    # kv_cache.py, 125 s quiet): keep each notebook near 2 minutes on 2 quiet cores.
    record_property("elapsed_s", round(elapsed, 1))


@pytest.mark.slow
def test_docs_build_strictly(tmp_path):
    """`mkdocs build --strict` with every notebook in the Tutorials (as `.ipynb` converted by
    jupytext, not executed: the pages' links, anchors and API references are in the markdown
    cells; the notebooks run in `test_notebook_runs`, which the two test workers share, so no one
    process has them all executed)."""
    pytest.importorskip("mkdocs")
    import jupytext

    site = tmp_path / "project"
    shutil.copytree(ROOT / "docs", site / "docs", ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    for p in NOTEBOOKS:
        jupytext.write(jupytext.read(p), site / "docs" / "tutorials" / f"{p.stem}.ipynb")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=site,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "processors" / "index.html").is_file()


def _tutorial_nav() -> list[str]:
    """The notebooks of the docs' Tutorials section, in the nav's order."""
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    tutorials = next(entry["Tutorials"] for entry in nav if "Tutorials" in entry)
    return [Path(next(iter(entry.values()))).stem for entry in tutorials]


def test_the_tutorials_are_a_course():
    """Every notebook is in the nav, opens with "Before this" and ends with a "Next" cell that
    links the notebook after it in the nav; the docs' home page lists them in the nav's order;
    every link to the wording page names a term defined there."""
    import jupytext

    order = _tutorial_nav()
    assert sorted(order) == sorted(p.stem for p in NOTEBOOKS)
    home = (ROOT / "docs" / "index.md").read_text()
    listed = re.findall(r"\]\(tutorials/(\w+)\.ipynb\)", home[home.index("## Where to go next") :])
    assert listed == order
    anchors = set(
        re.findall(r'<a id="([\w-]+)"></a>', (ROOT / "docs/concepts/wording.md").read_text())
    )
    for name, following in zip(order, [*order[1:], None]):
        cells = jupytext.read(ROOT / "notebooks" / f"{name}.py").cells
        markdown = [c.source for c in cells if c.cell_type == "markdown"]
        assert "**Before this:**" in markdown[0], name
        assert markdown[-1].startswith("## Next"), name
        if following is not None:
            assert f"](../{following}/)" in markdown[-1], (name, following)
        used = set(re.findall(r"\.\./\.\./concepts/wording/#([\w-]+)", "".join(markdown)))
        assert used <= anchors, (name, sorted(used - anchors))
