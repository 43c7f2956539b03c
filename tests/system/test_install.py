"""The desktop install path (packaging/): the built wheel works from a clean virtual environment;
the install script's tool commands and its launcher are right.

The clean-environment test installs what a user's install holds, from files and the package index
pip is configured with: the localspec wheel just built, the llama-cpp-python wheel this machine's
`packaging/build-llama-wheel.sh` cached (`make install` built it), and every dependency the wheel
declares, except torch. torch is left out because it is gigabytes where pip would fetch PyPI's
CUDA build, and nothing on the paths tested imports it (only a PyTorch draft does); `pip check`
must then report torch missing and nothing else, which proves the declared dependencies resolve
together. With torch present (LOCALSPEC_TEST_WITH_TORCH=1, e.g. where a CPU torch wheel lies
in pip's find-links) it is installed too and `pip check` must be clean.
"""
from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "packaging" / "install.sh"


def sh(*cmd: str | Path, timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def declared(wheel: Path) -> list[str]:
    """The wheel's runtime requirements (no extras), as its METADATA states them."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def test_wheel_runs_from_a_clean_venv(tmp_path, tiny):
    sh(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path / "dist", ROOT)
    (wheel,) = (tmp_path / "dist").glob("localspec-*.whl")
    reqs = declared(wheel)
    names = {re.split(r"[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}
    assert {"llama-cpp-python", "numpy", "torch", "transformers", "textual", "platformdirs",
            "jinja2", "gguf", "huggingface-hub"} <= names, reqs
    assert "llama-cpp-python==0.3.36" in reqs

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)   # no system site-packages, nothing of this checkout
    py, bin_ = venv / "bin" / "python", venv / "bin"
    llama = sh(ROOT / "packaging" / "build-llama-wheel.sh", env={**os.environ, "PYTHON": str(py)},
               timeout=1800).stdout.strip()
    with_torch = os.environ.get("LOCALSPEC_TEST_WITH_TORCH") == "1"
    others = [r for r in reqs if with_torch or not r.startswith("torch")]
    sh(py, "-m", "pip", "install", "-q", "--no-deps", wheel, timeout=600)
    sh(py, "-m", "pip", "install", "-q", llama, *others, timeout=600)   # the file meets ==0.3.36
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    problems = [line for line in check.stdout.splitlines() if line.strip()]
    if with_torch:
        assert check.returncode == 0, check.stdout
    else:
        assert problems == ["localspec 0.1.0 requires torch, which is not installed."], check.stdout

    away = tmp_path / "elsewhere"   # not the checkout: nothing can come from the source tree
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["LOCALSPEC_CONFIG_DIR"] = str(tmp_path / "config")
    version = sh(bin_ / "localspec", "--version", cwd=away, env=env)
    assert version.stdout.strip() == "localspec 0.1.0"
    where = sh(py, "-c", "import localspec.app.cli, llama_cpp; print(localspec.app.cli.__file__); "
               "print(llama_cpp.__file__)", cwd=away, env=env).stdout.split()
    assert all(p.startswith(str(venv)) for p in where), where
    # the installed engine answers (tiny model, GGUF draft: no torch needed)
    answer = sh(bin_ / "localspec", "ask", "def add(a, b):", "--model", tiny.target_gguf,
                "--draft", tiny.draft_gguf, "--ctx", "512", "--max-tokens", "16",
                cwd=away, env=env, input="")
    assert answer.stdout.strip()


def _launcher(apps: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str   # desktop keys are case-sensitive
    parser.read(apps / "localspec.desktop")
    return parser["Desktop Entry"]


@pytest.mark.parametrize("exe", ["/opt/tools/bin/localspec", "/home/a b/.local/bin/localspec"])
def test_desktop_launcher_points_at_the_tool(tmp_path, exe):
    sh("bash", INSTALL, "--desktop-only", "--exec", exe, env={**os.environ, "XDG_DATA_HOME": str(tmp_path)})
    entry = _launcher(tmp_path / "applications")
    quoted = f'"{exe}"' if " " in exe else exe
    assert entry["Exec"] == f"{quoted} chat" and entry["Terminal"] == "true"
    assert entry["Type"] == "Application" and entry["Name"] == "localspec"
    if shutil.which("desktop-file-validate"):
        sh("desktop-file-validate", tmp_path / "applications" / "localspec.desktop")


@pytest.mark.parametrize("tool", ["pipx", "uv"])
@pytest.mark.parametrize("cuda", [False, True])
def test_install_script_commands(tmp_path, tool, cuda):
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    proc = sh("bash", INSTALL, "--dry-run", "--tool", tool, *(["--cuda"] if cuda else []), env=env)
    lines = [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]
    text = "\n".join(lines)
    assert f"LOCALSPEC_CUDA={int(cuda)} " in text and "build-llama-wheel.sh" in text
    install = next(line for line in lines if line.startswith(f"{tool} ") and " install " in line)
    assert "--force" in install and "--find-links" in install and "localspec-" in install
    assert install.endswith(".whl[serve]")   # localspec serve's packages come with the tool
    if tool == "pipx":   # CPU: torch from PyTorch's CPU index; CUDA: PyPI's (CUDA) build
        assert ("--extra-index-url https://download.pytorch.org/whl/cpu" in install) is (not cuda)
    else:
        assert f"--torch-backend {'auto' if cuda else 'cpu'}" in install
    assert any("--no-deps" in line and "llama-cpp-python wheel" in line for line in lines)
    assert any(line.endswith("localspec --version") for line in lines)
    assert any("llama_supports_gpu_offload" in line for line in lines) is cuda
    assert "install launcher" in text and not (tmp_path / "applications").exists()   # dry run
