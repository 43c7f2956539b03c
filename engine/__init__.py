"""The decoding engine: a llama.cpp target verified against token trees grown by cheaper drafters.

Nothing here imports Textual; the app talks to the engine through `localspec.engine.session`.
Importing the package loads nothing native: llama.cpp's process-wide state (the load order
before numpy and torch, its libraries, its log, the numerics switches) belongs to
`localspec.engine.native`, which the modules that call llama.cpp import first.
"""
