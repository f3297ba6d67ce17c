#!/usr/bin/env bash
# Install vLLM 0.30.0 beside the CPU torch already in this Python environment, so the `vllm`
# backend's adapter (rlnorm/kit/backends/vllm.py) is tested against the real package.
#
# Usage:   bash .ci/install-vllm.sh            (uses `python3`; set PYTHON=/path/to/python to pick another)
# Needs:   torch already installed (`python3 -m pip install torch==2.13.0` takes the CPU wheel from disk).
# Does:    `pip install --no-deps vllm==0.30.0`, then ONLY the packages that `import vllm`,
#          `VllmConfig(...)` and `vllm.model_executor.layers.layernorm` really import, under
#          constraints that pin every package already installed (torch above all) and vLLM's own pins.
#          Never installs torchvision / torchaudio / torchcodec (their wheels break `import` beside
#          the CPU torch) nor vLLM's CUDA-only kernels packages; fails if one appears.
# Measured (this 2-core machine, fresh venv holding only torch 2.13.0+cpu): 76 s with no pip cache
#          (up to ~3 min when the cores are busy), site-packages +1194 MiB (vllm itself 800 MiB).
#          Into a python that already has the project's packages: 80 s, +884 MiB. See docs/vllm.md.
# Order:   before or after the project's own `pip install -e .[...]`: every package already present
#          is held at its version; run after it, nothing the project pinned is downloaded twice.
# Exit:    0 when `RMSNormGated` constructs under a vLLM config; non-zero with the reason otherwise.
set -euo pipefail
PY=${PYTHON:-python3}
VLLM_VERSION=0.30.0
start=$(date +%s)
export PIP_ROOT_USER_ACTION=ignore  # CI and this machine run as root; the warning says nothing here
say() { echo "install-vllm: $*"; }
quiet() {
    grep -v -e "is ignored: it is neither a file nor a directory" \
        -e "pip's dependency resolver does not currently take into account" \
        -e "^vllm $VLLM_VERSION requires" -e "^xgrammar .* requires" || true
}

if ! "$PY" -c "import torch" 2>/dev/null; then
    say "torch is not importable with $PY: install it first (python3 -m pip install torch==2.13.0)" >&2
    exit 2
fi
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
size_before=$(du -sk "$site" | cut -f1)
torch_version=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null)
say "python $("$PY" -c 'import sys; print(sys.executable)'), torch $torch_version, site-packages $site"

# 1. vLLM itself, without its dependency list (which pins torch, torchvision, torchaudio,
#    torchcodec and CUDA-only packages: a plain install would pull multi-GB CUDA wheels).
"$PY" -m pip install -q --no-deps "vllm==$VLLM_VERSION" 2>&1 | quiet

# 2. Constraints: every package already here stays at its version; vLLM's own pins hold.
"$PY" -c "import packaging" 2>/dev/null || "$PY" -m pip install -q packaging 2>&1 | quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$tmp/constraints.txt" <<'EOF'
import sys
from importlib.metadata import distributions, requires

from packaging.requirements import Requirement

lines = []
for dist in distributions():
    name = dist.metadata["Name"]
    if name and name.lower() != "vllm" and dist.version:
        lines.append(f"{name}=={dist.version}")
for raw in requires("vllm") or []:
    req = Requirement(raw)
    if req.marker is not None and "extra" in str(req.marker):
        continue
    if req.specifier:
        marker = f" ; {req.marker}" if req.marker is not None else ""
        lines.append(f"{req.name}{req.specifier}{marker}")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF

# 3. What the adapter's import path needs (found by importing it in a clean venv until nothing
#    was missing: `import vllm.model_executor.layers.layernorm`, `VllmConfig(device_config=...)`).
deps=(
    numpy regex "pydantic>=2.12.0" cbor2 psutil "pyzmq>=25.0.0" urllib3 "transformers>=5.10.4"
    "aiohttp>=3.13.3" "requests>=2.26.0" "openai-harmony>=0.0.3" "openai>=2.25.0" pillow pybase64
    cachetools msgspec cloudpickle uvloop py-cpuinfo "prometheus_client>=0.18.0"
    "fastapi>=0.133.0,<0.137.0" partial-json-parser "llguidance>=1.7.0,<1.8.0" einops packaging
    "apache-tvm-ffi==0.1.11" typing-extensions
)
"$PY" -m pip install -q -c "$tmp/constraints.txt" "${deps[@]}" 2>&1 | quiet
# xgrammar (imported by vllm.parser) declares triton and torch: with its dependencies it would pull
# the newest triton (~1 GB, outside the project's triton pin). Its other dependencies are above.
"$PY" -m pip install -q --no-deps "xgrammar>=0.2.1,<1.0.0" 2>&1 | quiet

# 4. Keep the wheels out that break `import` beside the CPU torch.
for bad in torchvision torchaudio torchcodec; do
    if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$bad') is None)"; then
        if ! err=$("$PY" -c "import $bad" 2>&1); then
            say "ERROR: $bad is installed and its import fails beside torch $torch_version:" >&2
            echo "$err" | tail -1 >&2
            say "remove it (python3 -m pip uninstall -y $bad): the vllm adapter does not need it" >&2
            exit 3
        fi
        say "note: $bad is installed and imports; left as it is"
    fi
done
if [[ "$("$PY" -c 'import torch; print(torch.__version__)')" != "$torch_version" ]]; then
    say "ERROR: torch changed during the install" >&2
    exit 4
fi

# 5. Prove it: the real class constructs under a vLLM config (running it needs a GPU driver).
"$PY" - <<'EOF'
import logging

import torch

logging.disable(logging.WARNING)
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.layernorm import RMSNormGated  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=device))):
    RMSNormGated(128, eps=1e-6, norm_before_gate=True)
import vllm  # noqa: E402

print(f"install-vllm: vllm {vllm.__version__} imports and RMSNormGated constructs (device {device})")
EOF

size_after=$(du -sk "$site" | cut -f1)
say "done in $(( $(date +%s) - start )) s; site-packages grew by $(( (size_after - size_before) / 1024 )) MiB"
