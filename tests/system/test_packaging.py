"""The wheel installs one top-level name, `localspec`; the engine never imports Textual, and
`localspec --version` never loads the engine."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_top_level_names(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("localspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"localspec"}, tops
    for module in ("localspec/engine/decode.py", "localspec/engine/drafters/maxgram.py",
                   "localspec/models/gguf_file.py", "localspec/app/cli.py"):
        assert module in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "localspec = localspec.app.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_engine_and_models_never_import_textual():
    code = ("import sys, pkgutil, importlib, localspec.engine, localspec.models\n"
            "for pkg in (localspec.engine, localspec.models):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "assert 'textual' not in sys.modules, 'textual was imported'\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    for path in list((ROOT / "engine").rglob("*.py")) + list((ROOT / "models").rglob("*.py")):
        text = path.read_text()
        assert "import textual" not in text and "from textual" not in text, path


def test_version_loads_neither_llama_cpp_nor_torch():
    """`localspec --version` answers without llama.cpp's libraries (slow to load, and absent
    where llama-cpp-python is not installed) or torch."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "localspec.app.cli", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"localspec {version('localspec')}\n"
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "localspec.app" in imported   # the listing is real
    for module in ("llama_cpp", "torch", "localspec.engine"):
        assert module not in imported, sorted(imported)
