"""The library's default Session runs what the command line runs by default."""
from localspec.engine.config import DEFAULT_TREE_NODES
from localspec.engine.options import Options


def test_the_library_default_runs_what_the_cli_runs(tiny):
    """Session(Options(model, draft=...)) with nothing else: the adaptive budget over calibrated
    costs, Max-Gram and the personal n-grams before the draft, as `localspec generate` does."""
    from localspec.engine.session import Session

    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1))
    try:
        assert [d.name for d in session.stages] == ["maxgram", "personal-ngram", "gguf-draft"]
        policy = session.engine.policy
        assert session.costs is not None and policy.bandit is not None   # adaptive, calibrated
        assert max(a.nodes for a in policy.arms + policy.dropped) == DEFAULT_TREE_NODES
        result = session.run(session.raw_prompt("def add(a, b):"), max_tokens=8)
        assert result.stats.tokens == len(result.tokens) > 0
    finally:
        session.close()
