#!/usr/bin/env bash
# The GPU check of issue 11, one command, under 5 minutes on a CUDA machine:
#   1. the tests marked `cuda` (`pytest -m cuda`: mixed-precision resumes, the GradScaler on
#      the device), which every other machine skips;
#   2. the async-write benchmark, bench/async_write.py, when it is present;
#   3. the CausalLM example's step time on the GPU, 32-true against bf16-mixed.
# Each step prints its figures; the exit status is 0 only when every step passed.
#
#   bash bench/gpu_check.sh              # uses .venv, creating it when absent
#   NITRO_PYTHON=/opt/py/bin/python bash bench/gpu_check.sh   # an interpreter that has torch+CUDA
#
# A new .venv sees the system's packages (--system-site-packages), so a CUDA build of torch
# already installed on the machine is used as is; pip fetches only what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

if [ -n "${NITRO_PYTHON:-}" ]; then
    PY=$NITRO_PYTHON
else
    if [ ! -x .venv/bin/python ]; then
        echo "== creating .venv (system site packages visible)"
        python3 -m venv --system-site-packages .venv || exit 2
        .venv/bin/python -m pip install -q -e ".[test]" || {
            echo "gpu_check: could not install the project into .venv (offline?); give an" \
                 "interpreter that has torch, safetensors, pydantic, mcp and pytest:" \
                 "NITRO_PYTHON=... bash bench/gpu_check.sh" >&2
            exit 2
        }
    fi
    PY=.venv/bin/python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, installed or not
export PYTHONUNBUFFERED=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS: A == B + C compares bits

echo "== device"
"$PY" - <<'EOF' || exit 2
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(
        f"gpu_check: torch {torch.__version__} sees no CUDA device (torch.version.cuda = "
        f"{torch.version.cuda}); run on a CUDA machine with a CUDA build of torch, or give one "
        "with NITRO_PYTHON=..."
    )
p = torch.cuda.get_device_properties(0)
print(
    f"{torch.cuda.get_device_name(0)}, {p.total_memory / 2**30:.0f} GiB, capability "
    f"{p.major}.{p.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
    f"bf16 {torch.cuda.is_bf16_supported()}"
)
EOF

status=0

echo "== pytest -m cuda"
t=$SECONDS
timeout 150 "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/ || status=1
echo "(pytest -m cuda: $((SECONDS - t)) s)"

echo "== bench/async_write.py"
if [ -f bench/async_write.py ]; then
    t=$SECONDS
    timeout 150 "$PY" bench/async_write.py || status=1
    echo "(async_write: $((SECONDS - t)) s)"
else
    echo "bench/async_write.py is not in this checkout: skipped"
fi

echo "== CausalLM step time on cuda:0"
t=$SECONDS
timeout 90 "$PY" - <<'EOF' || status=1
import contextlib
import io
import tempfile
import time

import torch

from nitro_core import Nitro
from nitro_core.examples import CausalLM

# a bigger model than the CPU default, so the step is GPU work and not launch overhead
size = dict(width=256, heads=4, depth=4, context=128, samples=4096, batch_size=32)
for precision in ("32-true", "bf16-mixed"):
    exp = CausalLM(mixed_precision=precision, accumulate=2, max_epochs=2, every_steps=32, **size)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        n = Nitro(exp, run_dir=tmp, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n.train()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    loss = n.history[-1]["val"]["loss"]
    print(
        f"{precision:>10}: {n.step} optimizer steps ({2 * n.step} batches) in {wall:.2f} s, "
        f"{1e3 * wall / n.step:.2f} ms/step with points and records; final val loss {loss:.3f}"
    )
EOF
echo "(CausalLM: $((SECONDS - t)) s)"

echo "== gpu_check: $([ $status -eq 0 ] && echo PASS || echo FAIL) in $((SECONDS - started)) s"
exit $status
