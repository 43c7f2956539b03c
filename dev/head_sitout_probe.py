"""What a start costs with an installed head that sits out on this machine (a fast GPU).

A start that loads the installed head only to leave it out pays for the head's tables, a GPU's
compile (from inductor's disk cache after the first) and its timing. build.py keeps the
measured share beside the calibration, so that later starts skip all of it. This times
`localspec calibrate` (a start's load, without a reply), each in a new process, in an empty
data folder with the head installed for the target:
  first      nothing cached: calibrations, the compile, the head's timing
  remembered the head's share kept: the head is not loaded
  forgotten  the share's file removed: the head loaded, compiled from the disk cache and timed
             again (what every start cost before the share was kept)
then `remembered` and `forgotten` again.

    python dev/head_sitout_probe.py --model target.gguf --head head.npz
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sitout-"))
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data)}
    installed = subprocess.run(
        [sys.executable, "-c", "import sys; from localspec.models.heads import default_head_path; "
                               "print(default_head_path(sys.argv[1]))", args.model],
        env=env, capture_output=True, text=True, check=True).stdout.strip()
    Path(installed).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.head, installed)

    def start(name: str) -> None:
        began = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", "calibrate", "--model", args.model],
                              env=env, capture_output=True, text=True)
        took = time.perf_counter() - began
        shares = sorted(p.name for p in data.rglob("*.share.json"))
        print(f"{name:<11} {took:6.1f} s  rc {proc.returncode}  share files {len(shares)}", flush=True)
        if proc.returncode:
            print(proc.stderr[-2000:])

    start("first")
    for _ in range(2):
        start("remembered")
        for p in data.rglob("*.share.json"):
            p.unlink()
        start("forgotten")
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
