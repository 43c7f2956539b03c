"""Hostile input, round two (issue 45): `localspec bench`'s own flags.

`--out` was checked only when the results were written, after the whole run, so a bad path lost
them: it is checked (made, and a file created in it) before anything loads, within QUICK_S.
`--configs plain` alone blamed `--tree-nodes 0`, a flag not given: it runs.
"""
from __future__ import annotations

import pytest
from test_hostile_cli import QUICK_S, assert_clean_error, run_cli


def _bench(tiny, out, *flags: str, timeout: float = QUICK_S):
    return run_cli("bench", "--model", str(tiny.target_gguf), "--ctx", "256", "--limit", "1",
                   "--max-tokens", "4", "--no-exec", "--out", str(out), *flags, timeout=timeout)


@pytest.mark.parametrize("case, cause", [("a-file", "is a file, not a folder"),
                                         ("under-a-file", "Not a directory"),
                                         ("under-proc", "No such file or directory")])
def test_an_out_path_that_cannot_be_written_is_refused_before_the_run(tiny, tmp_path, case, cause):
    afile = tmp_path / "afile"
    afile.write_text("kept")
    out = {"a-file": afile, "under-a-file": afile / "sub", "under-proc": "/proc/no-such/out"}[case]
    proc = _bench(tiny, out, "--configs", "maxgram")
    assert_clean_error(proc, "Cannot write the results", cause, "Pass --out a folder you can write in")
    assert b"tok/s" not in proc.stderr and afile.read_text() == "kept"


def test_plain_alone_runs_and_writes(tiny, tmp_path):
    proc = _bench(tiny, tmp_path / "out", "--configs", "plain", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "--tree-nodes" not in err, err
    assert (tmp_path / "out" / "bench.json").is_file()
