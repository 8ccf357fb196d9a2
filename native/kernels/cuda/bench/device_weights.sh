#!/usr/bin/env bash
# The real default model on the device machine, whose calls carry at most 64 MiB: the nvfp4
# folder (~90 MB) travels in two halves over two back-to-back calls (the machine keeps ignored
# build outputs between calls while it stays warm, ~30 s).
#   here:        device_weights.sh split            -> .dev-lead/{a,b}/ (halves, config, tokenizer, sha256)
#   device, 1st: device_weights.sh stage            (carry .dev-lead/a): half A into build/realw/
#   device, 2nd: device_weights.sh join             (carry .dev-lead/b): the folder reassembled and
#                checked under models/weights/smollm2-135m/nvfp4; exits 3 when half A is gone (the
#                machine was given back in between: run both calls again).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$root"
src=models/weights/smollm2-135m/nvfp4
case ${1:-} in
split)
  rm -rf .dev-lead/a .dev-lead/b && mkdir -p .dev-lead/a .dev-lead/b
  size=$(stat -c %s $src/model.safetensors); half=$(( (size / 2 / 1048576 + 1) * 1048576 ))
  head -c $half $src/model.safetensors > .dev-lead/a/model.part0
  tail -c +$(( half + 1 )) $src/model.safetensors > .dev-lead/b/model.part1
  cp $src/config.json $src/tokenizer.json .dev-lead/b/
  (cd $src && sha256sum model.safetensors config.json tokenizer.json) > .dev-lead/b/SHA256SUMS
  du -sh .dev-lead/a .dev-lead/b ;;
stage)
  mkdir -p build/realw && cp .dev-lead/a/model.part0 build/realw/ && ls -la build/realw ;;
join)
  [ -f build/realw/model.part0 ] || { echo "half A is not here (the machine was given back): stage again"; exit 3; }
  mkdir -p $src
  cat build/realw/model.part0 .dev-lead/b/model.part1 > $src/model.safetensors
  cp .dev-lead/b/config.json .dev-lead/b/tokenizer.json $src/
  (cd $src && sha256sum -c "$root/.dev-lead/b/SHA256SUMS") ;;
*) echo "usage: device_weights.sh split | stage | join" >&2; exit 2 ;;
esac
