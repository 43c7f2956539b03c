"""The wheel installs one top-level name, `localspec`, and the engine never imports Textual."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
