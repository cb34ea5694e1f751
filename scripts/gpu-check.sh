#!/usr/bin/env bash
# ft's GPU check in one command, for a fresh machine with one CUDA GPU and no internet (PyPI at most):
#   bash scripts/gpu-check.sh [--only NAME[,NAME]] [--jobs N] [--deadline S] ...   (options: scripts/gpu_check.py)
# 1. finds a Python whose torch sees a CUDA device: $FT_PYTHON if set, else python3, then python on PATH (no torch
#    is installed here: a CUDA build is gigabytes, and the right one depends on the machine). None: says what each
#    candidate lacked and exits 3.
# 2. makes ft's dependencies importable in that environment: when one is missing, `pip install -e '.[optim]'`
#    (torch already satisfies ft's `torch>=2.4`, so pip keeps it), else, when that fails (no index reachable),
#    `pip install --no-deps --no-build-isolation -e .`; ft itself always runs from src/ (PYTHONPATH), installed or
#    not. A core dependency still missing: exit 3 with the list. Optional ones (bitsandbytes, galore-torch, lomo-optim,
#    liger-kernel, ...) only turn their steps into SKIP. FT_GPU_INSTALL=never skips pip.
# 3. runs scripts/gpu_check.py with the time already spent, so its deadline (450 s by default) covers this setup too.
# --dry-run and --help need no CUDA: they go straight to gpu_check.py with any Python 3.
set -u
FT_GPU_CHECK_STARTED=${FT_GPU_CHECK_STARTED:-$(date +%s)}
export FT_GPU_CHECK_STARTED
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

say() { printf 'gpu-check: %s\n' "$*" >&2; }

for arg in "$@"; do
  case $arg in
    --dry-run | -h | --help)
      exec "${FT_PYTHON:-python3}" scripts/gpu_check.py "$@" ;;
  esac
done

# 1. a Python with CUDA torch
if [ -n "${FT_PYTHON:-}" ]; then candidates=("$FT_PYTHON"); else candidates=(python3 python); fi
PY=""
tried=()
for candidate in "${candidates[@]}"; do
  if ! command -v "$candidate" >/dev/null 2>&1; then
    tried+=("$candidate: not found"); continue
  fi
  if why=$(timeout 120 "$candidate" -c '
import sys
try:
    import torch
except Exception as exc:
    sys.exit(f"torch does not import ({exc.__class__.__name__}: {exc})")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no CUDA device")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
' 2>&1); then
    PY=$(command -v "$candidate"); say "using $PY: $why"; break
  fi
  tried+=("$(command -v "$candidate"): $(printf '%s' "$why" | tail -n 1)")
done
if [ -z "$PY" ]; then
  say "no CUDA: this check needs a Python whose torch sees a CUDA GPU, and none was found."
  for line in "${tried[@]}"; do say "  - $line"; done
  say "Install a CUDA build of torch for this machine's driver (or set FT_PYTHON to a Python that has one), then"
  say "rerun. 'python scripts/gpu_check.py --dry-run' lists the steps without a GPU."
  exit 3
fi

# 2. ft's dependencies in that environment
CORE=(transformers trl peft accelerate datasets pydantic yaml typer rich PIL)
OPTIONAL=(bitsandbytes galore_torch lomo_optim schedulefree apollo_torch grokadamw optimi liger_kernel)
missing() {  # the modules of "$@" that do not import, one line
  "$PY" -c '
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@"
}
missing_core=$(missing "${CORE[@]}")
missing_optional=$(missing "${OPTIONAL[@]}")
# liger-kernel is not one of ft's dependencies: its absence alone installs nothing
installable="$missing_core ${missing_optional//liger_kernel/}"
installable=$(echo "$installable" | xargs)  # trimmed
if [ -n "$installable" ]; then
  if [ "${FT_GPU_INSTALL:-auto}" = never ]; then
    say "missing: $installable; FT_GPU_INSTALL=never, so nothing is installed"
  else
    say "missing: $installable; pip install -e '.[optim]' into $PY's environment"
    if ! timeout 240 "$PY" -m pip install --retries 1 --timeout 20 -e '.[optim]' >&2; then
      say "pip install -e '.[optim]' failed (no package index reachable?); trying ft alone: --no-deps"
      timeout 120 "$PY" -m pip install --no-deps --no-build-isolation -e . >&2 \
        || say "that failed too; ft runs from src/ all the same (PYTHONPATH)"
    fi
    missing_core=$(missing "${CORE[@]}")
    missing_optional=$(missing "${OPTIONAL[@]}")
  fi
fi
if [ -n "$missing_core" ]; then
  say "ft cannot run: these dependencies do not import in $PY's environment: $missing_core"
  say "install them (pip install -e '.[optim]' where PyPI is reachable, or wheels brought along), then rerun."
  exit 3
fi
[ -n "$missing_optional" ] && say "not importable (their steps will SKIP): $missing_optional"

# 3. the check
exec "$PY" scripts/gpu_check.py "$@"
