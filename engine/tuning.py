"""Every tuned constant of the round's adaptation, named once: its value, why, and the decision
record in docs/decisions that holds the figures which chose it.

The modules read them from here when they run (`tuning.NAME`), so dev/ablate.py moves each in one
place and a reader sees every knob the policy turns on one screen. The configuration's own
defaults (tree and draft sizes: engine/config.py) and what calibration measures with
(engine/calibrate.py) stay beside their types.
"""
from __future__ import annotations

# --- the bandit over arms (budget.py) -------------------------------------------------------------
# An arm's sums of tokens and seconds age by this factor with each of its own plays: slow enough
# that one unlucky free round does not decide the free arm's estimate (0009).
ARM_DECAY = 0.98
# Rounds between probes of an arm as good as the best, times the square of how far it trails (0009).
EXPLORE_EVERY = 64
# The same while a model arm leads, for an arm without models: its probes cost no draft catch-up,
# and a stale estimate of the free arm would keep the draft arm on where the free one is faster (0009).
CHEAP_EVERY = 8
# Rounds in a row a probe of an arm without models plays: one free round says little (0009).
PROBE_ROUNDS = 4
# The longest wait between two probes of an arm (0009).
MAX_PROBE_GAP = 2048

# --- a free stage's gate (worth.py) -----------------------------------------------------------------
# Per round, the stage's mean seconds and accepted tokens age by this factor (0015).
WORTH_DECAY = 0.95
# Rounds before a stage that does not pay is tried again, times the square of its shortfall (0015).
WORTH_EVERY = 16
# The longest wait before such a stage is tried again (0015, 0029).
WORTH_MAX_GAP = 512
# A free stage grows at most GROW_FACTOR times what pruning kept of it lately (the larger of the
# last round's count and a mean aged by KEPT_DECAY a round), plus GROW_MARGIN: nodes grown only to
# be pruned are Python time that returns nothing; the factor lets a stage whose nodes are all kept
# double its growth a round, the margin keeps one whose nodes are all pruned guessing (0028).
GROW_FACTOR = 2
GROW_MARGIN = 4
KEPT_DECAY = 0.9

# --- pruning (prune.py) -----------------------------------------------------------------------------
# A (stage, class, depth) cell's rate backs off to its class's pool with the weight of BACKOFF
# observations, the pool to the stage's rate with POOL_BACKOFF: pruning keeps the highest
# estimates, so one that looks good by chance would be picked (0020).
BACKOFF = 8.0
POOL_BACKOFF = 4.0
# The acceptance counts age by this factor a counted round (0020).
ACCEPT_DECAY = 0.995

# --- batch shapes (shapes.py, policy.py) ------------------------------------------------------------
# Rounds a choice is held where batch shapes are kept stable: llama.cpp replays a CUDA graph only
# from the third call of one shape (0008).
HOLD = 16
# The sizes trees are padded to where a change of shape is cheap: llama.cpp captures a graph per
# size only after two calls of it, so sizes must be few (0008).
BUCKET_SIZES = (2, 4, 8, 16, 32)

# --- which arms and stages there are (config.py, costs.py, policy.py, drafters/head_stage.py) --------
# The tree sizes of the model drafters' arms, each capped at the run's largest tree: few, so each
# is measured often, and none past 16, where a neural draft's deeper guesses cost a forward each
# (no record of its own: the arms that 0001's calibration and 0009's bandit weigh).
MODEL_ARM_NODES = (4, 8, 16)
# Per-token acceptance assumed when asking whether an arm could ever beat plain decoding (0001).
OPTIMISTIC = 0.9
# A model drafter whose one-row step costs at most this share of the target's runs with the free
# stages, its worth weighed every round instead of in arms the bandit rarely probes (0041); an
# installed head drafts only there (0031, 0042).
FREE_STEP_SHARE = 0.1
