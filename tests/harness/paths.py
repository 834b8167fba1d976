"""Where the tests' files lie: the checkout, the recorded output of real runs (tests/data), and the cache of what the
slow tests download once (a Debian root, wheels), kept across runs."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
DATA = REPO / "tests" / "data"
REAL = DATA / "real"  # published training scripts' output, each made by the script beside it
CACHE = Path(os.environ.get("TFRUN_TEST_CACHE") or Path.home() / ".cache" / "tfrun-tests")
