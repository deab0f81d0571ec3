#!/usr/bin/env bash
# The pure-Python packages a GPU machine without a package registry lacks for the peers and for
# emitting there (docs/design.md, "Measuring"): FlashInfer's import-time modules (einops, tqdm,
# tabulate, click, requests and its four, nvidia-ml-py, packaging, filelock) and black with its
# own (a re-tune's `gdngen emit` formats what it writes). Run here, with pip and a registry:
#
#     bash tools/device_extras.sh .devbundle/c-extras.tar.xz
#
# The archive unpacks to one folder, c-extras/, which goes on PYTHONPATH after everything else
# so that the machine's own packages win:
#
#     export PYTHONPATH="$PYTHONPATH:/opt/gdn-site/c-extras"
#
# (a setup that unpacks every .tar.xz it is given into /opt/gdn-site puts it there).
set -euo pipefail
out=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --platform any -d "$work/wheels" \
  einops tqdm tabulate click requests urllib3 idna certifi charset-normalizer nvidia-ml-py \
  packaging filelock black mypy-extensions pathspec platformdirs pytokens
mkdir -p "$work/c-extras"
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/c-extras"
done
tar -C "$work" -cf - c-extras | xz -6 > "$out"
ls -la "$out"
