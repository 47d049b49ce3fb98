"""Execute the analysis notebook on a results directory (nbclient), writing the executed copy."""

from __future__ import annotations

import os
from pathlib import Path

from .files import write_atomic


def execute(notebook: Path, out: Path, results: Path, timeout: int = 600) -> Path:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    old = os.environ.get("SPECENS_RESULTS")
    os.environ["SPECENS_RESULTS"] = str(Path(results).resolve())
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    finally:
        if old is None:
            os.environ.pop("SPECENS_RESULTS", None)
        else:
            os.environ["SPECENS_RESULTS"] = old
    write_atomic(Path(out), nbformat.writes(nb))
    return Path(out)
