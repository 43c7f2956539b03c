"""packaging/patches' CPU kernels in their AVX2 forms, on a machine whose own build takes the
AVX-512 ones (the forms CPUs without AVX-512 run would otherwise go untested there):
test_multicol.py again, in a process of its own, against the AVX2 build of the same patched
llama.cpp that packaging/build-llama-wheel.sh makes beside the wheel on AVX-512 CPUs (the venv's
avx2-ggml/, copied there by `make install`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

AVX2 = Path(sys.prefix) / "avx2-ggml"
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not (AVX2 / "libllama.so").exists(),
                                reason="no AVX2 build beside this one (made by `make install` on "
                                       "AVX-512 CPUs with a cmake on the PATH)")


def _env() -> dict[str, str]:
    # LD_LIBRARY_PATH too: the build's RUNPATH names its build folder, gone since
    return {**os.environ, "LLAMA_CPP_LIB_PATH": str(AVX2), "LD_LIBRARY_PATH": str(AVX2)}


def test_the_avx2_build_is_what_the_child_process_loads():
    probe = ("from localspec.engine import native; "
             "print(native.has_multicol_kernels(), native.has_multicol_q8_0_kernels())")
    out = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "False"], out   # the kernels, without the AVX-512-only Q8_0 rows' one


def test_the_avx2_kernels_pass_the_kernel_tests():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(HERE / "test_multicol.py")], env=_env(), capture_output=True,
                          text=True, timeout=600, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("Q8_0 rows' kernel" in line for line in skipped), skipped
