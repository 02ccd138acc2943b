"""`import functional_gen` does not load the HTTP stack (the `serve` extra is optional)."""

import subprocess
import sys


def test_importing_the_package_does_not_import_fastapi():
    code = (
        "import sys, functional_gen as fg; fg.serving.Engine; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
