#!/usr/bin/env bash
# The GPU checks on a CUDA machine WITHOUT network access (how docs/gpu.md's H100 numbers
# were taken). Prepare on a machine with pip access, in the repository root:
#   scripts/gpu_check_offline.sh --prepare      # wheels + sdists into .gpu/ (git-ignored)
# then copy the repository (with .gpu/) to the GPU machine and run there:
#   scripts/gpu_check_offline.sh [LOG_DIR]
# It builds mamba-ssm and causal-conv1d from their sdists for this GPU's architecture only
# (their setup.py builds eight: an hour; one: ~2.5 and ~6 minutes side by side on 12 cores;
# none where .gpu/prebuilt/ holds them for this torch and architecture: see below), installs
# lark and fla from wheels, and runs the CUDA lane (per-test timeouts) and the cost projection,
# logs in LOG_DIR. What needs neither library runs first, on 4 pinned cores while the builds
# use the others (detached, in $BUILD outside the repository: a build outlives its call and
# the next call on the same warm machine reuses it).
#
# GPU_CHECK_STEPS picks what runs, in this order (default "stacked cost rest shared"):
#   reference (only when named) benchmarks/reference_cost.py: the MAD reference implementation
#            (mad-lab, Lightning, one run at a time) trained at each task's baseline on this GPU, per
#            epoch, and its paper protocol projected (GPU_REFERENCE_ARGS adds arguments); prepare with
#            --prepare-reference MAD_LAB on a machine with pip access and carry .gpu/reference
#   stacked  grid-batched (stacked) training and its CUDA graphs against the unbatched runs
#   cost     benchmarks/protocol_cost.py: each task's baseline, its grid graph-replayed, and every
#            sequence length of its sweep as `madsl eval` trains it here (--shapes): the projection
#            (GPU_COST_ARGS adds arguments: "--grid-modes stacked graphs", "--measure-stop 1")
#   rest     the rest of the lane; fla's tests last (on a cold Triton cache they compile their
#            kernels: the lane runs one configuration of each, tests/test_cuda.py), stopped a
#            minute before GPU_CALL_SECONDS to return Triton's cache
#   shared   3 worker processes sharing the GPU against one (attention-sg, two tasks' baseline
#            grids), without MPS (the processes' contexts take turns) and with it (their kernels
#            run side by side), where nvidia-cuda-mps-control is found
#   stop     (only when named) protocol_cost.py --measure-stop 1: each task's baseline grid trained until
#            early stopping ends it (200 epochs at most), the fraction of epochs it took; stopped after
#            GPU_STOP_SECONDS (240), each task's line printed as it ends (GPU_STOP_ARGS: --specs, --tasks)
#   compiled (only when named) benchmarks/compiled_step.py: the stacked step compiled by inductor
#            (MADSL_COMPILE_STACKED=1) against the eager one, both replayed as CUDA graphs, for
#            attention-sg and hyena-sg in bf16 at in-context recall's baseline shape: kernels,
#            compile seconds (cold and with the cache warm), step times, parity; stopped after
#            GPU_COMPILED_SECONDS (360), before "shared"
# The device tool gives one command 10 minutes: run "stacked cost", then "rest", then (time
# left) "shared", as calls back to back on the warm machine.
#
# Where $OUT is set (this workplace's device tool: what is written there comes back, at most 8
# files of 16 MiB), the logs come back as one archive, freshly built libraries (stripped) as
# xz-compressed parts named <package>-torch<version>-sm<arch>.tar.xz.partN, and Triton's cache
# as triton-cache-torch<version>-sm<arch>.tar.xz.partN. Kept here with
#   scripts/gpu_check_offline.sh --keep-prebuilt DIR      # DIR: where the returned files lie
# the libraries go into .gpu/prebuilt/ (next run: no builds) and the cache into .gpu/triton/
# (next run: no autotuning). Both do not fit in one call's 64 MiB: carry .gpu/wheels,
# .gpu/sdist and .gpu/prebuilt on the first call, .gpu/wheels, .gpu/sdist and .gpu/triton on
# the "rest" call.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
BUILD=${GPU_BUILD_DIR:-/tmp/madsl-gpu-build}  # outside the repository: kept between calls on one machine
if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p $GPU/wheels $GPU/sdist
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $GPU/wheels \
        lark==1.3.1 flash-linear-attention==0.6.0 fla-core==0.6.0 || exit 1
    MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE python3 -m pip download --no-deps \
        --no-build-isolation --no-binary :all: -d $GPU/sdist mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0 || exit 1
    echo "prepared $GPU/ ($(du -sh $GPU | cut -f1))"; exit 0
fi
if [[ "${1:-}" == "--prepare-reference" ]]; then  # --prepare-reference MAD_LAB: the "reference" step's inputs
    src=${2:?--prepare-reference MAD_LAB (a checkout of athms/mad-lab)}
    [[ -f $src/train.py && -d $src/mad && -d $src/configs ]] || { echo "$src is not a mad-lab checkout"; exit 1; }
    rm -rf $GPU/reference/mad-lab; mkdir -p $GPU/reference/mad-lab $GPU/reference/wheels
    cp -r "$src/mad" "$src/configs" "$src/train.py" "$src/LICENSE" $GPU/reference/mad-lab/
    # its requirements that the measured layers import (train.py, Lightning, data, metrics), with
    # Lightning's own dependencies; torch is the GPU machine's
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -d $GPU/reference/wheels pytorch-lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0 \
        einops==0.8.2 opt_einsum==3.4.0 pandas==3.1.1 numpy==2.5.5 python-dateutil==4.0.0 tzdata pytz tqdm \
        pyyaml packaging typing_extensions "fsspec==2026.9.0" aiohttp aiohappyeyeballs aiosignal attrs \
        frozenlist multidict propcache yarl idna || exit 1
    echo "prepared $GPU/reference/ ($(du -sh $GPU/reference | cut -f1))"; exit 0
fi
if [[ "${1:-}" == "--keep-prebuilt" ]]; then
    mkdir -p $GPU/prebuilt $GPU/triton
    found=$(ls "${2:?--keep-prebuilt DIR}"/*-torch*-sm*.tar.xz.part* 2>/dev/null | grep -v /triton-cache-)
    cache=$(ls "$2"/triton-cache-*.tar.xz.part* 2>/dev/null)
    [[ -n "$found$cache" ]] || { echo "no prebuilt parts in $2"; exit 1; }
    [[ -z "$found" ]] || { cp $found $GPU/prebuilt/ && echo "kept in $GPU/prebuilt/:" && ls -la $GPU/prebuilt/; }
    [[ -z "$cache" ]] || { rm -f $GPU/triton/*; cp $cache $GPU/triton/ && echo "kept in $GPU/triton/:" && ls -la $GPU/triton/; }
    exit 0
fi
LOG=${1:-gpu-check-$(date +%Y%m%d-%H%M%S)}; mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s); elapsed() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -1; uptime; } >> "$LOG/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/madsl-site $GPU/wheels/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/madsl-site
ARCH=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")') || exit 1
TORCH_TAG=$(python3 -c 'import torch; print(torch.__version__.replace("+", "_"))')
prebuilt() { echo "$GPU/prebuilt/$1-torch$TORCH_TAG-sm$ARCH.tar.xz.part"; }  # prebuilt NAME: its parts' prefix
python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())' >> "$LOG/env.txt"
export TORCH_CUDA_ARCH_LIST="${ARCH:0:1}.${ARCH:1}" MAX_JOBS=$(( $(nproc) > 8 ? $(nproc) - 4 : 2 )) \
    MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE
# The builds take minutes: they run on all cores but four, while what needs neither library is
# checked and timed on those four (note the build's load beside any time taken meanwhile).
PIN_BUILD=""; PIN_CHECK=""
if command -v taskset > /dev/null && (( $(nproc) > 8 )); then
    PIN_BUILD="taskset -c 4-$(( $(nproc) - 1 ))"; PIN_CHECK="taskset -c 0-3 env OMP_NUM_THREADS=4"
fi
start_build() {  # start_build NAME: unpack (or take prebuilt) and build for this architecture only, detached
    local name=$1 dir=$BUILD/$1
    [[ -f $dir/.done ]] && { echo "$name: built by an earlier call"; return 0; }
    [[ -f $dir/.pid ]] && ! grep -q "build rc=" "$dir/build.log" 2> /dev/null && { echo "$name: still building"; return 0; }
    rm -rf "$dir"; mkdir -p "$dir"
    tar xzf $GPU/sdist/${name}-*.tar.gz -C "$dir" --strip-components=1
    python3 - "$dir/setup.py" "$ARCH" <<'PY'
import sys
path, arch = sys.argv[1], sys.argv[2]
text = open(path).read()
marker = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert marker in text, "setup.py changed: update scripts/gpu_check_offline.sh"
text = text.replace(marker, f'        cc_flag = ["-gencode", "arch=compute_{arch},code=sm_{arch}"]\n\n' + marker, 1)
open(path, "w").write(text.replace('"--ptxas-options=-v",', ""))
PY
    if [[ $name == mamba_ssm ]]; then  # madsl imports only its ops: the package __init__ also imports models that need more
        printf '__version__ = "%s"\n\nfrom mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn\n' \
            "$(ls $GPU/sdist/mamba_ssm-*.tar.gz | sed 's/.*mamba_ssm-\(.*\)\.tar\.gz/\1/')" > "$dir/mamba_ssm/__init__.py"
    fi
    if ls "$(prebuilt $name)"* > /dev/null 2>&1; then
        cat "$(prebuilt $name)"* | tar xJf - -C "$dir" && touch "$dir/.done" "$dir/.prebuilt" && echo "$name: prebuilt, not built"
        return 0
    fi
    # detached (setsid): a build the command's end would kill goes on for the next call on this machine
    setsid bash -c "cd '$dir' && $PIN_BUILD python3 setup.py build_ext --inplace > build.log 2>&1 \
        && touch .done; echo \"$name build rc=\$? at \$(( \$(date +%s) - $T0 )) s of the call that started it\" >> build.log" \
        < /dev/null > /dev/null 2>&1 &
    echo $! > "$dir/.pid"; echo "$name: building (pid $!)"
}
wait_build() {  # wait_build NAME: until its build ends; its log kept, its libraries returned under $OUT once
    local name=$1 dir=$BUILD/$1
    # its log's last line marks the end (an orphaned build's pid can linger as a zombie)
    while [[ -f $dir/.pid ]] && ! grep -q "build rc=" "$dir/build.log" 2> /dev/null; do sleep 2; done
    cp "$dir/build.log" "$LOG/build-$name.log" 2> /dev/null && tail -n 1 "$LOG/build-$name.log"
    if [[ -f $dir/.done && ! -f $dir/.prebuilt && ! -f $dir/.returned && -n "${OUT:-}" ]]; then  # for --keep-prebuilt
        # stripped: 59 MB for both libraries instead of 62, so that with the wheels they fit in a call's 64 MiB
        (cd "$dir" && strip --strip-unneeded *.so; XZ_OPT="-T0 -6" tar cJf - *.so) \
            | split -b 15M -d -a 1 - "$OUT/$(basename "$(prebuilt $name)")" \
            && touch "$dir/.returned" && ls -la "$OUT" | grep "$name"
    fi
    echo "$name: $([[ -f $dir/.done ]] && echo built || echo 'NOT built') at $(elapsed) s"
}
export PYTHONPATH=$PYTHONPATH:$BUILD/mamba_ssm:$BUILD/causal_conv1d
# side by side: mamba-ssm ~2 min, causal-conv1d ~5; GPU_BUILDS="" builds none (an idle machine for timings)
BUILDS=${GPU_BUILDS-mamba_ssm causal_conv1d}
built() { [[ " $BUILDS " == *" $1 "* ]]; }
for name in $BUILDS; do start_build $name; done
[[ -n $BUILDS ]] || PIN_CHECK=""  # nothing builds beside the checks: they get every core
left() {  # seconds this call has left for a part, keeping 20 to pack the logs (GPU_CALL_SECONDS: the call's limit)
    local n=$(( ${GPU_CALL_SECONDS:-100000} - $(elapsed) - 20 )); (( n > 10 )) && echo $n || echo 10
}
# Triton's cache (compiled kernels and, as fla asks, autotuning results): fla's kernels take
# minutes a shape on a cold one. Seeded from .gpu/triton/ where an earlier run returned it.
export TRITON_CACHE_DIR=$BUILD/triton-cache
if [[ ! -d $TRITON_CACHE_DIR ]] && ls $GPU/triton/triton-cache-*.part* > /dev/null 2>&1; then
    mkdir -p "$TRITON_CACHE_DIR" && cat $GPU/triton/triton-cache-*.part* | tar xJf - -C "$TRITON_CACHE_DIR" \
        && echo "Triton cache: $(du -sh "$TRITON_CACHE_DIR" | cut -f1) from an earlier run"
fi
return_triton_cache() {  # its parts under $OUT for --keep-prebuilt (45 MB at most: the rest of $OUT is the logs')
    [[ -n "${OUT:-}" && -d $TRITON_CACHE_DIR ]] || return 0
    XZ_OPT="-T0 -3" tar cJf /tmp/triton-cache.tar.xz -C "$TRITON_CACHE_DIR" . 2> /dev/null
    local size=$(stat -c %s /tmp/triton-cache.tar.xz)
    if (( size <= 45 * 1024 * 1024 )); then
        split -b 15M -d -a 1 /tmp/triton-cache.tar.xz "$OUT/triton-cache-torch$TORCH_TAG-sm$ARCH.tar.xz.part"
        echo "Triton cache returned: $size bytes"
    else
        echo "Triton cache not returned: $size bytes compressed, over 45 MB"
    fi
}
TIMEOUT=$(python3 -c 'import pytest_timeout' 2>/dev/null && echo "--timeout 150")
want() { [[ " ${GPU_CHECK_STEPS:-stacked cost rest shared} " == *" $1 "* ]]; }
pack_logs() {  # the logs so far, as one file under $OUT (what a command cut short at its limit still returns)
    [[ -n "${OUT:-}" ]] && tar czf "$OUT/gpu-check-logs.tar.gz" -C "$LOG" . 2>/dev/null
    return 0
}
imports() { python3 -m madsl.kernels.cuda | tee -a "$LOG/imports.txt"; }
lane() {  # lane NAME PIN -k EXPR [FILES]: pytest on the CUDA lane, its summary on stdout
    local name=$1 pin=$2; shift 2
    $pin python3 -m pytest -v -rs --tb=short -p no:cacheprovider $TIMEOUT "$@" > "$LOG/lane-$name.log" 2>&1
    echo "lane $name rc=$? at $(elapsed) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/lane-$name.log" | tail -n 12
    pack_logs
}
cost() {  # cost NAME PIN SPECS...: the projection, from the baselines and from every shape measured
    local name=$1 pin=$2; shift 2
    $pin timeout $(left) python3 -u benchmarks/protocol_cost.py --device cuda --precision bf16 --grid-examples baseline \
        --grid-modes graphs --shapes ${GPU_COST_ARGS:-} --specs "$@" > "$LOG/cost-$name.txt" 2>&1
    echo "cost projection ($name) rc=$? at $(elapsed) s"; grep -E "^\S|^  [a-z]" "$LOG/cost-$name.txt" | grep -v Warning
    pack_logs
}
STACKED="(fold or grid_group or cuda_graphs) and not (fla or gla or rwkv or causal_conv1d)"
# attention and Hyena first, on the pinned cores while the libraries build; Mamba once mamba-ssm is built
if want reference; then  # mad-lab's own training of the same baselines on this GPU (prepared by --prepare-reference)
    python3 -m pip install -q --no-index --find-links $GPU/reference/wheels pytorch-lightning torchmetrics einops \
        pandas opt_einsum > "$LOG/reference-install.txt" 2>&1 \
        || python3 -m pip install -q --break-system-packages --no-index --find-links $GPU/reference/wheels \
            pytorch-lightning torchmetrics einops pandas opt_einsum >> "$LOG/reference-install.txt" 2>&1
    timeout $(( $(left) < ${GPU_REFERENCE_SECONDS:-300} ? $(left) : ${GPU_REFERENCE_SECONDS:-300} )) \
        python3 -u benchmarks/reference_cost.py --mad-lab $GPU/reference/mad-lab \
        ${GPU_REFERENCE_ARGS:-} > "$LOG/reference.txt" 2>&1
    echo "reference (mad-lab) rc=$? at $(elapsed) s"; grep -E "^\S|^  [a-z]" "$LOG/reference.txt" | grep -v Warning
    pack_logs
fi
want stacked && lane stacked-attention-hyena "$PIN_CHECK" tests/test_cuda.py -k "($STACKED) and not mamba"
if want cost; then  # a part a spec, so that a call cut short returns the specs done
    for spec in ${GPU_COST_SPECS:-attention-sg hyena-sg}; do cost $spec "$PIN_CHECK" specs/paper/$spec.mad; done
fi
{ echo "during the builds:"; uptime; } >> "$LOG/env.txt"
if (want stacked || want cost) && built mamba_ssm; then
    wait_build mamba_ssm; imports
    want stacked && lane stacked-mamba "" tests/test_cuda.py -k "($STACKED) and mamba"
    want cost && cost mamba "" specs/paper/mamba.mad
fi
if want rest; then  # what needs causal-conv1d after its build; fla's autotuning (minutes a shape) last
    wait_build mamba_ssm
    lane rest "" tests/test_cuda.py tests/test_gpu_paths.py tests/test_precision.py \
        -k "not ($STACKED) and not (fla or gla or rwkv or retention or delta or causal_conv1d)"
    wait_build causal_conv1d; imports
    lane causal-conv1d "" tests/test_cuda.py -k "causal_conv1d or (grid_group and mamba)"
    # fla's tests last, stopped in time (GPU_CALL_SECONDS: the call's limit) to return what they compiled
    left=$(( ${GPU_CALL_SECONDS:-100000} - $(elapsed) - 60 )); (( left > 30 )) || left=30
    TIMEOUT=${TIMEOUT/150/400} lane fla "timeout $left" tests/test_cuda.py tests/test_gpu_paths.py \
        -k "fla or gla or rwkv or retention or delta"  # a test may autotune several kernels: 400 s each
    return_triton_cache
fi
if want stop; then  # early stopping measured: each task's baseline grid trained as the protocol trains it
    timeout $(( $(left) < ${GPU_STOP_SECONDS:-240} ? $(left) : ${GPU_STOP_SECONDS:-240} )) \
        python3 -u benchmarks/protocol_cost.py --device cuda --precision bf16 \
        --grid-examples 0 --no-shapes --measure-stop 1 ${GPU_STOP_ARGS:-} > "$LOG/stop.txt" 2>&1
    echo "stop fraction rc=$? at $(elapsed) s"; grep -E "^\S|^  [a-z]" "$LOG/stop.txt" | grep -v Warning
    pack_logs
fi
if want compiled; then  # only when named (not in the default steps); at most 6 minutes, a line per spec as it ends
    timeout ${GPU_COMPILED_SECONDS:-360} python3 -u benchmarks/compiled_step.py --device cuda --precision bf16 \
        --seq-len 128 --batch-size 128 ${GPU_COMPILED_ARGS:-} > "$LOG/compiled-step.txt" 2>&1
    echo "compiled step rc=$? at $(elapsed) s"; grep -E "^\S|^  " "$LOG/compiled-step.txt" | grep -v Warning
    pack_logs
fi
share() {  # share NAME: 3 worker processes on the GPU against one, two steady epochs of two baseline grids
    python3 benchmarks/protocol_cost.py --device cuda --precision bf16 --grid-examples 0 --no-shapes --workers-per-device 3 \
        --tasks in-context-recall compression --specs specs/paper/attention-sg.mad > "$LOG/shared-$1.txt" 2>&1
    echo "shared ($1) rc=$? at $(elapsed) s"; grep -E "workers|Error" "$LOG/shared-$1.txt"
    pack_logs
}
if want shared; then  # without MPS the processes' CUDA contexts take turns on the GPU; with it their kernels overlap
    share contexts
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/madsl-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/madsl-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d; then
        share mps
        echo quit | nvidia-cuda-mps-control
    else
        echo "MPS: nvidia-cuda-mps-control not found or did not start"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
[[ -n "${OUT:-}" ]] && echo "logs: \$OUT/gpu-check-logs.tar.gz"
