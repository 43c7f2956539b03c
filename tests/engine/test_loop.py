"""The decode loop with each batch-shape mode on the tiny models and a scripted cost curve: what
the policy planned and what the target then verified, round by round, hold the rules of the mode
(held choices, padding, trees within their arm), every stage the arm runs proposes while it has
room, and the output stays plain decoding's."""
from __future__ import annotations

import pytest
from localspec.engine.costs import Costs
from localspec.engine.config import GenerationRequest, TreeBudget
from localspec.engine.decode import Engine
from localspec.engine.generation import finish
from localspec.engine.policy import make_policy
from localspec.engine.session import Session
from localspec.engine.shapes import Shapes
from localspec.engine.tuning import BUCKET_SIZES, HOLD
from localspec.engine.stats import PHASES
from localspec.engine.options import Options
from test_cascade import PROMPT
from test_greedy_equality import PROMPTS as GREEDY_PROMPTS

CURVE = {1: 1e-3, 2: 1.02e-3, 4: 1.05e-3, 8: 1.1e-3, 16: 1.3e-3, 32: 1.6e-3}   # GPU-like: flat
DRAFT = {1: 3e-4, 2: 3.1e-4, 4: 3.2e-4, 8: 3.3e-4}   # a draft model's: in arms (policy.free_stages)
MAX_TOKENS = 120
# (the tiny models are trained on each machine, and where their continuations end differs: the
# last prompt ran longest of those tried on a machine where the others all ended within 16 rounds)
PROMPTS = [PROMPT] + [text for kind, text in GREEDY_PROMPTS if kind == "raw"] + [
    "def largest(numbers):\n    best = numbers[0]\n"]
MODES = {Shapes.FREE: (False, Costs(CURVE, DRAFT)),
         Shapes.BUCKETS: (True, Costs(CURVE, DRAFT, switch=4e-4)),
         Shapes.STABLE: (True, Costs(CURVE, DRAFT, switch=3e-3))}


def recording(stage, calls: list[list]) -> None:
    """Wrap `stage.propose` to note (stage index, tree.n before, after) in the round's list, calls[-1]."""
    inner = stage.propose

    def propose(tree, index, budget, sampling, rng):
        before = tree.n
        inner(tree, index, budget, sampling, rng)
        calls[-1].append((index, before, tree.n))
    stage.propose = propose


def proposed_wherever_room_was_left(plan, calls: list, stages) -> bool:
    """Whether each of the plan's stages proposed when the tree had room left for it (a model
    stage with none ends the round's drafting), in order, each on the tree the last one left."""
    made = {index: (before, after) for index, before, after in calls}
    expected, n = [], 1
    for index in plan.stages:
        if plan.budget(index, n - 1) <= 0:
            if index not in plan.free:
                break
            continue
        if made.get(index, (None,))[0] != n:
            return False
        expected.append(index)
        n = made[index][1]
    return [index for index, _, _ in calls] == expected


@pytest.mark.parametrize("mode", list(MODES), ids=[m.value for m in MODES])
def test_rounds_keep_their_modes_rules(tiny, mode):
    offloaded, costs = MODES[mode]
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                   calibrate=False, stable_shapes=offloaded))
    try:
        policy = make_policy(TreeBudget(max_nodes=16, adaptive=True), session.stages, costs, offloaded)
        assert policy.shapes is mode and policy.bandit is not None
        engine = Engine(session.engine.target, session.stages, policy)
        rounds: list[list] = []                 # [plan, tokens verified, pad_to, top_up]
        calls: list[list] = []                  # per round: the stages' proposes (recording)
        for d in session.stages:
            recording(d, calls)
        firsts: list[tuple] = []                # each generation's first round: (tokens, pad_to, calls)
        plan, verify = policy.plan, engine.target.verify
        policy.plan = lambda room: (rounds.append([plan(room)]), calls.append([]), rounds[-1][0])[2]

        def verifying(tree, pad_to=0, top_up=True):
            if not rounds:                      # no plan yet: the generation's first round
                firsts.append((tree.n, pad_to, sum(map(len, calls))))
            else:
                rounds[-1].extend([tree.n, pad_to, top_up])
            return verify(tree, pad_to, top_up)
        engine.target.verify = verifying
        generations = []
        for text in PROMPTS:
            tokens = plain.raw_prompt(text)
            got = finish(engine.generate(GenerationRequest(tuple(tokens), MAX_TOKENS)))
            assert got.tokens == plain.run(tokens, max_tokens=MAX_TOKENS).tokens
            assert len(rounds) + 1 == got.stats.target_calls
            assert firsts[-1] == (1, 0, 0)      # its root alone, unpadded, drafted by no stage
            assert all(proposed_wherever_room_was_left(r[0], c, session.stages) for r, c in zip(rounds, calls))
            generations.append(rounds[:])
            rounds.clear()
            calls.clear()
    finally:
        session.close()
        plain.close()
    every = [r for g in generations for r in g]
    assert any(n > 1 for _, n, _, _ in every), "the repetitive prompt should speculate"
    for planned, n, pad_to, top_up in every:
        arm = planned.arm
        assert arm in policy.arms and n <= planned.room + 1 <= arm.nodes + 1
        if n == 1 or mode is Shapes.FREE:
            assert pad_to == 0                                    # the root alone stays one token
        elif mode is Shapes.BUCKETS:
            assert pad_to >= n and not top_up and (pad_to in BUCKET_SIZES or pad_to == arm.nodes + 1)
        else:
            assert pad_to == arm.nodes + 2 and top_up            # the arm's full tree, every round
    assert len({planned.arm for planned, *_ in every}) > 1, "a fresh bandit measures every arm"
    assert max(map(len, generations)) > HOLD, "no generation long enough to test a held choice"
    for g in generations:
        arms = [planned.arm for planned, *_ in g]
        changes = [i for i in range(1, len(arms)) if arms[i] != arms[i - 1]]
        if mode is Shapes.STABLE:                 # a choice is held HOLD rounds from the start
            assert all(i % HOLD == 0 for i in changes), changes
    if mode is not Shapes.STABLE:                 # chosen every round: the first measure each arm
        first = [planned.arm for planned, *_ in generations[0]][:len(policy.arms)]
        assert len(set(first)) == len(first), first


def test_a_round_is_charged_without_the_catching_up_its_stages_owe(tiny):
    """What a stage owes for rounds it sat out (decode.py `_propose`) is spent in the round that
    runs it, but the bandit charges the round's arm without it: here every catch-up takes 30 ms,
    far above any of these tiny rounds, and no round is charged that much."""
    import time

    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                              calibrate=False))
    try:
        policy = make_policy(TreeBudget(max_nodes=16, adaptive=True), session.stages, MODES[Shapes.FREE][1], False)
        engine = Engine(session.engine.target, session.stages, policy)
        slow = 0.03
        for d in session.stages:   # catching up is slow once a round: later calls find nothing owed
            owed = [False]
            d.accept = (lambda inner, owed: lambda new, states=None: (owed.__setitem__(0, True),
                                                                 inner(new, states))[1])(d.accept, owed)
            d.catch_up = (lambda inner, owed: lambda: (
                owed[0] and time.sleep(slow), owed.__setitem__(0, False), inner())[2])(d.catch_up, owed)
        charged: list[float] = []
        update = policy.bandit.update
        policy.bandit.update = lambda arm, tokens, seconds: (charged.append(seconds), update(arm, tokens, seconds))[1]
        tokens = session.raw_prompt(PROMPT)
        got = finish(engine.generate(GenerationRequest(tuple(tokens), MAX_TOKENS)))
    finally:
        session.close()
    # every round but the first (its root alone: no arm chosen) is charged
    assert len(charged) == got.stats.target_calls - 1 and got.stats.seconds["propose"] >= slow   # they ran
    assert set(got.stats.seconds) == set(PHASES) and min(got.stats.seconds.values()) > 0   # each lapped
    assert max(charged) < slow, sorted(charged)[-5:]
    # each stage's own time is counted apart from what it caught up on
    stages = got.stats.stages
    assert all(st.rounds > 0 for st in stages if sum(st.proposed)), [st.to_dict() for st in stages]
    assert 0 < sum(st.seconds for st in stages) < got.stats.seconds["propose"] - slow
    assert {"rounds", "propose_seconds"} <= set(stages[0].to_dict())
