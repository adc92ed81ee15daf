"""The selection kernels' exactness tests on the CPU, in Triton's interpreter (CI has no GPU).

Runs a subset of ``tests/test_select_kernel_gpu.py`` in a subprocess with ``TRITON_INTERPRET=1``
(Triton chooses the interpreter when a kernel is defined, so the rest of the suite keeps its
normal import of the kernels): every input kind (random, ties, equal scores, +-0 / +-inf / NaN
payloads, padding, duplicate ids) at small shapes on both paths and the row kernel's tiles
(registers; chunks of 128, 4096 and 8192 candidates; the staged path with and without the
finish for the cutoff bin) against the plain-Python and
the packed-key references, every final ordering after both paths, winners whose keys cluster,
digit widths, empty rows and bad input, the staged cutoff bin at the rank_play boundary and its
narrowing (by the score's second digit or the id's top digit), the row
kernel's sampled cutoff (kept, not kept, at the tile's boundary).
The same kernels run compiled on the GPU machine (the whole of that file). Skipped where Triton
does not import. With pytest-xdist (the ``test`` extra) the subset runs on two workers: about 190 s
against 330 serially on CI's two cores (measured then); 272 s on a slower shared 2-core box
(2026-12-02, 446 tests); 388-398 s on such a box on 2026-12-03 (458 tests), so the staged cases,
whose programs the interpreter runs one after another, take fewer rows or shorter rows here
than on the GPU: 302-320 s after that (451 tests), a box whose times vary by a fifth; 352 s in a
whole-suite run of 842 s on a later day (456 tests); 368 s alone on 2026-12-05 (483 tests), after
which each digit width runs on one path here (480 tests, 375-416 s on a shared box); then every other
cell of the three largest grids (the small cases, the final orderings, the row kernel's sampled
cutoff), 274 s alone (295 tests); and of the row
kernel's mass ties in registers and the staged path's narrowing, 240 s alone (280 tests); a
third of those five grids' cells since session 30 (``_interpreter_third``), the whole suite having
reached 974 s on this box.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

# digit widths: each width on one path here (all six cases on the GPU), 24 s of CI's CPU saved
SUBSET = ("small or clustered or order_buckets or final_orderings or no_candidates or rejects"
          " or (digit_widths and not 3-registers and not 7-registers and not 8-chunked)"
          " or references or rank_play or narrowing or mass_tie or refine_every_bin or refine_threshold or sampled"
          " or smallest_cut or tie_cut or fuzz")
MIN_TESTS = 213  # the subset's size today: fewer passing means tests went missing


@pytest.mark.timeout(1200)
def test_selection_kernels_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    workers = min(2, os.cpu_count() or 1)
    xdist = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *xdist,
                        os.path.join(here, "test_select_kernel_gpu.py"), "-k", SUBSET],
                       env=env, capture_output=True, text=True, timeout=1100)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= MIN_TESTS, tail
