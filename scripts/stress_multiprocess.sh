#!/usr/bin/env bash
# Run the 2-process CPU training of tests/test_multiprocess.py many times on a loaded machine and count the
# failures, by kind. A race between the ranks' threads (gloo, DDP, ft's own) shows only under load: a single run
# on a quiet machine almost always passes, so one green test run proves little.
#
#   scripts/stress_multiprocess.sh [N] [-- EXTRA FT TRAIN ARGS...]
#
#   N          runs (default 20)
#   BURNERS    busy loops started for the whole stress (default: 2, one per core here)
#   PARALLEL   torchrun jobs at once (default 2; keep it <= 3 on a small machine)
#   KEEP       1 keeps the temporary folder with every run's log
#   SRC        the ft sources to run (default: a copy of src/ taken at the start, so that edits made to the
#              working tree meanwhile do not change the code under test halfway through)
#
# e.g. scripts/stress_multiprocess.sh 20 -- --set train.enable_jit_checkpoint=false
# Run it from the repository root with the virtual environment active. Exits 1 when any run failed.
set -uo pipefail

N=${1:-20}
shift || true
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")
BURNERS=${BURNERS:-2}
PARALLEL=${PARALLEL:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ft-stress.XXXXXX")
if [[ -z "${SRC:-}" ]]; then
    cp -r "$ROOT/src" "$WORK/src"
    SRC="$WORK/src"
fi
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1

burners=()
cleanup() {
    for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null; done
    [[ "${KEEP:-0}" == 1 ]] && echo "logs kept in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq "$BURNERS"); do
    (while :; do :; done) &
    burners+=($!)
done

# The recipe of test_two_processes_train_data_parallel_and_write_the_run_once (tests/conftest.py::tiny_sft).
recipe() {  # recipe DIR
    python - "$ROOT" "$1" <<'EOF'
import sys
from pathlib import Path

import yaml

root, run = Path(sys.argv[1]), Path(sys.argv[2])
recipe = {
    "method": "sft",
    "model": {"name": str(root / "assets/tiny-llama"), "init": "random"},
    "data": {"train": [{"path": str(root / "data/arithmetic/train.jsonl"), "format": "chat"}],
             "eval": [{"path": str(root / "data/arithmetic/eval.jsonl"), "format": "chat"}],
             "max_length": 64, "prepared_path": str(run / "prepared")},
    "optimizer": {"lr": 3.0e-3},
    "train": {"output_dir": str(run / "out"), "max_steps": 10, "per_device_train_batch_size": 8,
              "save_strategy": "steps", "save_steps": 10, "report_to": "none"},
}
(run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
EOF
}

one_run() {  # one_run I: exit status and log in $WORK/I
    local run="$WORK/$1"
    mkdir -p "$run" && recipe "$run"
    (cd "$run" && timeout 600 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m ft train "$run/recipe.yaml" "${EXTRA[@]}" >"$run/log" 2>&1)
    echo $? >"$run/rc"
}

started=$SECONDS
runs=()
for i in $(seq "$N"); do
    one_run "$i" &
    runs+=($!)
    while (($(jobs -rp | wc -l) >= PARALLEL + BURNERS)); do wait -n; done  # the burners never end
done
wait "${runs[@]}"

failed=0 abort=0 terminate=0 timeout=0
for i in $(seq "$N"); do
    run="$WORK/$i" rc=$(cat "$WORK/$i/rc")
    ok=0
    [[ "$rc" == 0 ]] && grep -q "ft: done" "$run/log" && [[ -f "$run/out/final/config.json" ]] && ok=1
    ((ok)) && continue
    failed=$((failed + 1))
    grep -qE "SIGABRT|Signal 6" "$run/log" && abort=$((abort + 1))
    grep -q "terminate called" "$run/log" && terminate=$((terminate + 1))
    [[ "$rc" == 124 ]] && timeout=$((timeout + 1))
    echo "run $i failed (exit $rc):"
    grep -E "terminate called|SIGABRT|Signal 6|Error|error" "$run/log" | head -8 | sed 's/^/    /'
    cp "$run/log" "$WORK/failed-$i.log"
done
echo "stress: $failed of $N runs failed ($abort SIGABRT, $terminate 'terminate called', $timeout timeouts);" \
     "$BURNERS burners, $PARALLEL at once, $((SECONDS - started))s; ft from $SRC; ft train args: ${EXTRA[*]:-(none)}"
((failed == 0))
