#!/usr/bin/env python3
"""CTest entry of the Python suite: runs pytest on this folder, or exits 77 (CTest's skip)
saying why when torch or pytest cannot be imported."""
import os
import sys

for name in ("torch", "pytest"):
    try:
        __import__(name)
    except ImportError as e:
        print(f"python_torch: skipped: {name} is not importable ({e})")
        sys.exit(77)

import tempfile  # noqa: E402

import pytest  # noqa: E402

# A fresh compile cache each run: Inductor's cache does not see a change to a custom op's fake
# kernel, and a stale compiled graph would test old code.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="flexc-inductor-"))

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", here] + sys.argv[1:]))
