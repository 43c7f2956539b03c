"""The decoding engine: a llama.cpp target verified against token trees grown by cheaper drafters.

Nothing here imports Textual; the app talks to the engine through `localspec.engine.api`.
"""
