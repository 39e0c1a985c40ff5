#!/usr/bin/env bash
# The GPU checks on a CUDA machine WITHOUT network access (how docs/runner.md's H100 numbers
# were taken). Prepare on a machine with pip access, in the repository root:
#   scripts/gpu_check_offline.sh --prepare      # wheels + sdists into .gpu/ (git-ignored)
# then copy the repository (with .gpu/) to the GPU machine and run there:
#   scripts/gpu_check_offline.sh [LOG_DIR]
# It builds mamba-ssm and causal-conv1d from their sdists for this GPU's architecture only
# (their setup.py builds eight: an hour; one: ~2 and ~5 minutes on 16 cores; none where
# .gpu/prebuilt/ holds them for this torch and architecture: see below), installs
# lark and fla from wheels, runs the CUDA lane with per-test timeouts (fla's Triton kernels
# autotune for minutes per shape on a cold cache) and the cost benchmark; logs in LOG_DIR. Grid-batched
# (stacked) training, with and without CUDA graphs, is checked and measured first: attention and
# Hyena on two cores while the libraries build on the others, then Mamba.
#
# Where $OUT is set (this workplace's device tool: what is written there comes back, at most 8
# files of 16 MiB), the logs come back as one archive, and freshly built libraries as
# xz-compressed parts named <package>-torch<version>-sm<arch>.tar.xz.partN. Kept here with
#   scripts/gpu_check_offline.sh --keep-prebuilt DIR      # DIR: where the returned files lie
# they go into .gpu/prebuilt/, travel with .gpu/, and spare the next run its builds.
#
# GPU_CHECK_STEPS picks what runs after the builds (default "stacked rest"): "stacked" checks and
# times grid-batched training (minutes), "rest" runs the rest of the lane and the cost projection.
# The device tool gives one command 10 minutes: there, run them as two calls, "stacked" then "rest".
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p $GPU/wheels $GPU/sdist
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $GPU/wheels \
        lark==1.3.1 flash-linear-attention==0.6.0 fla-core==0.6.0 || exit 1
    MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE python3 -m pip download --no-deps \
        --no-build-isolation --no-binary :all: -d $GPU/sdist mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0 || exit 1
    echo "prepared $GPU/ ($(du -sh $GPU | cut -f1))"; exit 0
fi
if [[ "${1:-}" == "--keep-prebuilt" ]]; then
    mkdir -p $GPU/prebuilt
    found=$(ls "${2:?--keep-prebuilt DIR}"/*-torch*-sm*.tar.xz.part* 2>/dev/null)
    [[ -n "$found" ]] || { echo "no prebuilt parts in $2"; exit 1; }
    cp $found $GPU/prebuilt/ && echo "kept in $GPU/prebuilt/:" && ls -la $GPU/prebuilt/; exit 0
fi
LOG=${1:-gpu-check-$(date +%Y%m%d-%H%M%S)}; mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s); elapsed() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -1; uptime; } > "$LOG/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/madsl-site $GPU/wheels/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/madsl-site
ARCH=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")') || exit 1
TORCH_TAG=$(python3 -c 'import torch; print(torch.__version__.replace("+", "_"))')
prebuilt() { echo "$GPU/prebuilt/$1-torch$TORCH_TAG-sm$ARCH.tar.xz.part"; }  # prebuilt NAME: its parts' prefix
python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())' >> "$LOG/env.txt"
for name in mamba_ssm causal_conv1d; do  # unpack, and build for this architecture only
    rm -rf "$GPU/build/$name"; mkdir -p "$GPU/build/$name"
    tar xzf $GPU/sdist/${name}-*.tar.gz -C "$GPU/build/$name" --strip-components=1
    python3 - "$GPU/build/$name/setup.py" "$ARCH" <<'PY'
import sys
path, arch = sys.argv[1], sys.argv[2]
text = open(path).read()
marker = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert marker in text, "setup.py changed: update scripts/gpu_check_offline.sh"
text = text.replace(marker, f'        cc_flag = ["-gencode", "arch=compute_{arch},code=sm_{arch}"]\n\n' + marker, 1)
open(path, "w").write(text.replace('"--ptxas-options=-v",', ""))
PY
done
# madsl imports only mamba-ssm's ops: its package __init__ also imports models that need more
printf '__version__ = "%s"\n\nfrom mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn\n' \
    "$(ls $GPU/sdist/mamba_ssm-*.tar.gz | sed 's/.*mamba_ssm-\(.*\)\.tar\.gz/\1/')" > "$GPU/build/mamba_ssm/mamba_ssm/__init__.py"
export TORCH_CUDA_ARCH_LIST="${ARCH:0:1}.${ARCH:1}" MAX_JOBS=$(( $(nproc) > 4 ? $(nproc) - 2 : 2 )) \
    MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE
# The builds take minutes: they run on all cores but two, while what needs neither library is
# checked and timed on those two (the timing thread has its core; note the build's load beside it).
PIN_BUILD=""; PIN_CHECK=""
if command -v taskset > /dev/null && (( $(nproc) > 4 )); then
    PIN_BUILD="taskset -c 2-$(( $(nproc) - 1 ))"; PIN_CHECK="taskset -c 0,1 env OMP_NUM_THREADS=2"
fi
BUILT=()  # the libraries built in this run (not prebuilt)
for name in mamba_ssm causal_conv1d; do
    if ls "$(prebuilt $name)"* > /dev/null 2>&1; then
        cat "$(prebuilt $name)"* | tar xJf - -C "$GPU/build/$name" && echo "$name: prebuilt, not built"
        continue
    fi
    BUILT+=($name)
    (cd "$GPU/build/$name" && $PIN_BUILD python3 setup.py build_ext --inplace > "$LOG/build-$name.log" 2>&1; \
     echo "$name build rc=$? at $(elapsed) s" >> "$LOG/build-$name.log") &
done
TIMEOUT=$(python3 -c 'import pytest_timeout' 2>/dev/null && echo "--timeout 300")
want() { [[ " ${GPU_CHECK_STEPS:-stacked rest} " == *" $1 "* ]]; }
pack_logs() {  # the logs so far, as one file under $OUT (what a command cut short at its limit still returns)
    [[ -n "${OUT:-}" ]] && tar czf "$OUT/gpu-check-logs.tar.gz" -C "$LOG" . 2>/dev/null
    return 0
}
STACKED="(fold or grid_group or cuda_graphs) and not (fla or gla or rwkv)"  # fla's (autotuning) in the rest
# Grid-batched (stacked) training first, cheap and decisive: the member folds, the stacked groups and
# their CUDA graphs against their unbatched runs (fla's, which autotune for minutes, in the lane below),
# then stacked vs lockstep vs unbatched vs stacked + CUDA graphs (warm: best of 2 rounds) at one step
# per run (16 examples) and at 8 (1024). Attention and Hyena while the libraries build; Mamba after.
bench() {  # bench NAME ARGS...: the grid comparison (pinned by $PIN), its lines on stdout
    local name=$1; shift
    $PIN python3 benchmarks/protocol_cost.py --device cuda --precision bf16 --grid-only --grid-repeats 2 \
        --tasks in-context-recall selective-copying "$@" > "$LOG/stacked-$name.txt" 2>&1
    echo "stacked benchmark ($name) rc=$? at $(elapsed) s"; grep -E "^\S|^  [a-z]" "$LOG/stacked-$name.txt" | grep -v Warning
}
if want stacked; then
    $PIN_CHECK python3 -m pytest -v -rs --tb=short -p no:cacheprovider $TIMEOUT tests/test_cuda.py \
        -k "($STACKED) and not (mamba or causal_conv1d)" > "$LOG/stacked-lane-attention-hyena.log" 2>&1
    echo "stacked lane (attention, Hyena) rc=$? at $(elapsed) s"
    grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/stacked-lane-attention-hyena.log" | tail -n 12
    { echo "during the builds:"; uptime; } >> "$LOG/env.txt"
    PIN=$PIN_CHECK bench attention-hyena-16 --grid-examples 16 --specs specs/paper/attention-sg.mad specs/paper/hyena-sg.mad
    pack_logs
fi
wait
for name in "${BUILT[@]}"; do
    tail -n 1 "$LOG/build-$name.log"
    if [[ -n "${OUT:-}" ]] && ls "$GPU/build/$name"/*.so > /dev/null 2>&1; then  # for the next run: --keep-prebuilt
        (cd "$GPU/build/$name" && XZ_OPT="-T0 -3" tar cJf - *.so) | split -b 15M -d -a 1 - "$OUT/$(basename "$(prebuilt $name)")"
    fi
done
[[ -n "${OUT:-}" ]] && ls -la "$OUT" | grep part
export PYTHONPATH=$PYTHONPATH:$PWD/$GPU/build/mamba_ssm:$PWD/$GPU/build/causal_conv1d
python3 -c '
from madsl.kernels import cuda
for name, ops in (("mamba-ssm", cuda.mamba_ssm_ops()), ("causal-conv1d", cuda.causal_conv1d_ops()),
                  ("flash-linear-attention", cuda.fla_gla_ops())):
    print(f"{name:24s} {\"imports\" if ops else \"MISSING\"}")' | tee "$LOG/imports.txt"
pack_logs
if want stacked; then
    python3 -m pytest -v -rs --tb=short -p no:cacheprovider $TIMEOUT tests/test_cuda.py \
        -k "($STACKED) and (mamba or causal_conv1d)" > "$LOG/stacked-lane-mamba.log" 2>&1
    echo "stacked lane (Mamba) rc=$? at $(elapsed) s"
    grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/stacked-lane-mamba.log" | tail -n 12
    PIN="" bench mamba-16 --grid-examples 16 --specs specs/paper/mamba.mad
    pack_logs
    PIN="" bench all-1024 --grid-examples 1024
    pack_logs
fi
if want rest; then
    python3 -m pytest -v -rs --tb=short -p no:cacheprovider $TIMEOUT tests/test_cuda.py tests/test_gpu_paths.py \
        tests/test_precision.py -k "not ($STACKED)" > "$LOG/lane.log" 2>&1  # the rest
    echo "CUDA lane rc=$? at $(elapsed) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/lane.log" | tail -n 20
    pack_logs
    python3 benchmarks/protocol_cost.py --device cuda --precision bf16 > "$LOG/protocol_cost.txt" 2>&1
    echo "cost benchmark rc=$? at $(elapsed) s"; grep -E "^\S|^  [a-z]" "$LOG/protocol_cost.txt" | grep -v Warning
    pack_logs
fi
[[ -n "${OUT:-}" ]] && echo "logs: \$OUT/gpu-check-logs.tar.gz"
