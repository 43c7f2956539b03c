"""The decoding engine: a llama.cpp target verified against token trees grown by cheaper drafters.

Nothing here imports Textual; the app talks to the engine through `localspec.engine.session`.

llama_cpp is imported first, on purpose: on the CUDA development host, loading a model segfaulted
inside llama_model_load_from_file whenever numpy or torch had been imported before llama_cpp
(shared-library load order). Importing any engine module now loads llama.cpp's libraries first.
"""
import llama_cpp  # noqa: F401  (load order; see above)
