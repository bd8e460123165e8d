"""A product's bits do not depend on how many threads compute it (the premise of the
seeded-output contract when ``overlap_nodes`` changes a node's thread count).

Each case runs in a fresh interpreter: MKL fixes its mode on first use, so the order of
``import mstar`` and the first torch product is what is under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL: nothing to set")

# Row counts and widths that differed between 1 and 2 threads on a 2-core AMD EPYC host in
# MKL's default mode (2026-12-04); on other CPUs the default mode may happen to agree.
PROBE = """
import torch
import torch.nn.functional as F
outs = {}
for threads in (1, 2):
    torch.set_num_threads(threads)
    for rows in (1, 5, 10, 17, 64):
        for k, n in ((2048, 512), (512, 2048), (256, 3072)):
            g = torch.Generator().manual_seed(rows * k + n)
            x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
            outs.setdefault((rows, k, n), []).append(F.linear(x, w))
same = all(torch.equal(a, b) for a, b in outs.values())
"""


def run(code: str, env: dict[str, str] | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**base, **(env or {})},
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout + out.stderr


def test_importing_mstar_first_makes_products_independent_of_the_thread_count():
    out = run("import mstar\nfrom mstar.blas_reproducibility import strict_mode_active\n" + PROBE
              + "print('strict', strict_mode_active(), 'same', same)")
    assert "strict True same True" in out, out


def test_torch_used_before_mstar_is_detected_and_warned_about():
    code = "import torch\ntorch.ones(2, 2) @ torch.ones(2, 2)\nimport logging\nlogging.basicConfig()\n" \
           "import mstar\nfrom mstar.blas_reproducibility import strict_mode_active, warn_if_thread_dependent\n" \
           "print('strict', strict_mode_active())\nwarn_if_thread_dependent()\nwarn_if_thread_dependent()\n"
    out = run(code)
    assert "strict False" in out, out
    assert out.count("MKL is not in its strict reproducibility mode") == 1, out


def test_a_mode_the_user_set_is_kept():
    out = run("import mstar, os\nfrom mstar.blas_reproducibility import strict_mode_active\n"
              "print(os.environ['MKL_CBWR'], strict_mode_active())", env={"MKL_CBWR": "AUTO"})
    assert "AUTO False" in out, out
