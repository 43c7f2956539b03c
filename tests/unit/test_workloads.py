"""The chat workloads (app/workloads.py): `chat` is one problem discussed then asked for again;
`longchat` the same request after five other problems were discussed first, for contexts of a
few thousand tokens."""
from __future__ import annotations

from localspec.app.workloads import build, humaneval_problems


def _turns(workload: str, limit: int) -> list[list[dict]]:
    seen: list[list[dict]] = []
    build(workload, limit, lambda text: [0], lambda turns: seen.append(turns) or [len(seen)])
    return seen


def test_longchat_asks_chats_request_after_five_other_problems():
    problems = humaneval_problems()
    short, long = _turns("chat", 3), _turns("longchat", 3)
    assert len(short) == len(long) == 3
    for i, (a, b) in enumerate(zip(short, long)):
        assert len(a) == 3 and len(b) == 13                      # 6 problems x (question, answer) + request
        assert b[-3:] == a                                        # the same last problem and request
        shown = [t["content"] for t in b[:-3:2]]                  # the users' earlier questions
        others = [problems[(i + j) % len(problems)] for j in range(5, 0, -1)]
        assert all(q["prompt"] in s for q, s in zip(others, shown))
        assert sum(len(t["content"]) for t in b) > 4 * sum(len(t["content"]) for t in a)
