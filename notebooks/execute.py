"""Execute the notebooks at the size their parameters cells set and save them with their outputs
and a note of how long they took, as a reader finds them: `python notebooks/execute.py [NAME ...]`
(after a change that moves what they show)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def execute(path: Path) -> float:
    """Run `path` top to bottom in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=None, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}}).execute()
    took = time.perf_counter() - start
    (note,) = [c for c in nb.cells if "run-time" in c.metadata.get("tags", [])]
    note.source = (f"*The outputs shown ran in {took:.0f} s at the size set above, on "
                   f"{os.cpu_count()} CPU cores; the full size (in the comments) takes far longer.*")
    nbformat.write(nb, path)
    return took


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb")):
        print(f"{name}: {execute(HERE / name):.0f} s")
