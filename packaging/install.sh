#!/usr/bin/env bash
# Install localspec as an isolated desktop tool (pipx or uv tool), CPU or CUDA, with a launcher.
#
#   packaging/install.sh                      # CPU, with pipx (uv when pipx is missing)
#   packaging/install.sh --cuda --tool uv     # llama.cpp built with CUDA, PyPI's CUDA torch
#   packaging/install.sh --desktop-only [--exec PATH]   # only the launcher, for an existing install
#
# Steps: build the localspec wheel; build (or reuse from the cache) llama-cpp-python for this
# machine with packaging/build-llama-wheel.sh; install both into the tool's own virtual
# environment, then force that exact llama wheel in (the resolver could otherwise take another
# build of the same version); check `localspec --version` (and GPU offload for --cuda); install
# packaging/localspec.desktop into ~/.local/share/applications with Exec pointing at the tool.
#
# torch: PyPI's Linux torch is the CUDA build (GBs of NVIDIA libraries), so the CPU install asks
# PyTorch's CPU index for it (uv: --torch-backend cpu); the CUDA install takes PyPI's (uv:
# --torch-backend auto, the build for the installed driver). --torch-index URL picks another
# index (e.g. .../whl/cu124), --torch-index none leaves torch to the installer's configuration.
# --find-links DIR (repeatable) adds a folder of wheels: an offline install from a wheelhouse.
#
# Options: --cuda  --tool pipx|uv  --python PY  --torch-index URL|none  --find-links DIR
#          --no-desktop  --desktop-only  --exec PATH  --dry-run (print the commands, change nothing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cuda=0; tool=""; py=${PYTHON:-python3}; torch_index=default; desktop=1; desktop_only=0
exe=""; dry=0; extra_links=()
while [ $# -gt 0 ]; do
  case $1 in
    --cuda) cuda=1 ;;
    --tool) tool=$2; shift ;;
    --python) py=$2; shift ;;
    --torch-index) torch_index=$2; shift ;;
    --find-links) extra_links+=("$2"); shift ;;
    --no-desktop) desktop=0 ;;
    --desktop-only) desktop_only=1 ;;
    --exec) exe=$2; shift ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

run() {  # show a command, run it unless --dry-run
  echo "+ $*" >&2
  [ "$dry" = 1 ] || "$@"
}

install_desktop() {  # $1: the localspec executable
  local apps=${XDG_DATA_HOME:-$HOME/.local/share}/applications exec_path=$1
  case $exec_path in *\ *) exec_path="\"$exec_path\"" ;; esac   # the desktop spec's quoting
  echo "+ install launcher $apps/localspec.desktop (Exec=$exec_path chat)" >&2
  [ "$dry" = 1 ] && return
  mkdir -p "$apps"
  sed "s|^Exec=localspec |Exec=$exec_path |" "$here/localspec.desktop" > "$apps/localspec.desktop.tmp"
  chmod 644 "$apps/localspec.desktop.tmp"
  mv "$apps/localspec.desktop.tmp" "$apps/localspec.desktop"
  if command -v update-desktop-database >/dev/null; then update-desktop-database "$apps" || true; fi
}

if [ "$desktop_only" = 1 ]; then
  exe=${exe:-$(command -v localspec || true)}
  [ -n "$exe" ] || { echo "install.sh: no localspec on PATH; pass --exec PATH" >&2; exit 2; }
  install_desktop "$exe"
  exit 0
fi

if [ -z "$tool" ]; then
  if command -v pipx >/dev/null; then tool=pipx; elif command -v uv >/dev/null; then tool=uv
  else echo "install.sh: needs pipx or uv (e.g. 'python3 -m pip install --user pipx')" >&2; exit 2; fi
fi
case $tool in pipx|uv) ;; *) echo "install.sh: --tool pipx or uv, not '$tool'" >&2; exit 2 ;; esac

# 1. the two wheels
dist=$(mktemp -d "${TMPDIR:-/tmp}/localspec-dist.XXXX")
trap 'rm -rf "$dist"' EXIT
if [ "$tool" = uv ]; then run uv build --wheel --out-dir "$dist" "$root"
else run "$py" -m build --wheel --outdir "$dist" "$root"; fi
llama_cmd="LOCALSPEC_CUDA=$cuda PYTHON=$py $here/build-llama-wheel.sh"
echo "+ $llama_cmd" >&2
if [ "$dry" = 1 ]; then
  wheel="$dist/localspec-<version>-py3-none-any.whl"; llama="<the llama-cpp-python wheel it prints>"
  links="<its folder>"
else
  wheel=$(ls "$dist"/localspec-*.whl)
  llama=$(LOCALSPEC_CUDA=$cuda PYTHON=$py "$here/build-llama-wheel.sh")
  links=$(dirname "$llama")
fi

# 2. the isolated install, with that llama build and the extras a desktop tool runs: `serve`
# (localspec serve's FastAPI and uvicorn, from the same indexes and --find-links as the rest)
extras="[serve]"
if [ "$tool" = pipx ]; then
  pip_args="--find-links $links"
  for l in "${extra_links[@]}"; do pip_args+=" --find-links $l"; done
  if [ "$torch_index" = default ] && [ "$cuda" = 0 ]; then torch_index=https://download.pytorch.org/whl/cpu; fi
  case $torch_index in default|none) ;; *) pip_args+=" --extra-index-url $torch_index" ;; esac
  run pipx install --force --python "$py" --pip-args "$pip_args" "$wheel$extras"
  run pipx runpip localspec install --force-reinstall --no-deps "$llama"
  bin_dir=$( [ "$dry" = 1 ] && echo '<pipx bin dir>' || pipx environment --value PIPX_BIN_DIR)
  venv_py=$( [ "$dry" = 1 ] && echo '<pipx venv>/bin/python' || echo "$(pipx environment --value PIPX_LOCAL_VENVS)/localspec/bin/python")
else
  uv_args=(--find-links "$links")
  for l in "${extra_links[@]}"; do uv_args+=(--find-links "$l"); done
  case $torch_index in
    default) if [ "$cuda" = 1 ]; then uv_args+=(--torch-backend auto); else uv_args+=(--torch-backend cpu); fi ;;
    none) ;;
    *) uv_args+=(--extra-index-url "$torch_index" --index-strategy unsafe-best-match) ;;
  esac
  run uv tool install --force --python "$py" "${uv_args[@]}" "$wheel$extras"
  venv_py=$( [ "$dry" = 1 ] && echo '<uv tool dir>/localspec/bin/python' || echo "$(uv tool dir)/localspec/bin/python")
  run uv pip install --python "$venv_py" --reinstall --no-deps "$llama"
  bin_dir=$( [ "$dry" = 1 ] && echo '<uv tool bin dir>' || uv tool dir --bin)
fi

# 3. checks and the launcher
exe="$bin_dir/localspec"
run "$exe" --version
if [ "$cuda" = 1 ]; then
  run "$venv_py" -c 'import sys, llama_cpp; ok = llama_cpp.llama_supports_gpu_offload(); print("llama.cpp GPU offload:", ok); sys.exit(0 if ok else 1)'
fi
if [ "$desktop" = 1 ]; then install_desktop "$exe"; fi
case ":$PATH:" in *":$bin_dir:"*) ;; *) echo "note: add $bin_dir to PATH to run localspec from a terminal" >&2 ;; esac
echo "installed: $exe" >&2
