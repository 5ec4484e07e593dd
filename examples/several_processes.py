"""Training on several processes: the same script as on one.

    torchrun --nproc_per_node 2 examples/several_processes.py                 # DDP
    torchrun --nproc_per_node 2 examples/several_processes.py --strategy fsdp # FSDP2

On a machine without GPUs the ranks talk over gloo; with GPUs each rank takes
``cuda:LOCAL_RANK`` and nccl. Run it again and it resumes the latest record (bit-for-bit on
the same number of processes).
"""

from __future__ import annotations

import argparse

from nitro_core import Nitro
from nitro_core.examples import Regression


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--strategy", default="auto", choices=("auto", "ddp", "fsdp"))
    p.add_argument("--run-dir", default="runs/several_processes")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    n = Nitro(
        Regression(max_epochs=args.epochs),
        run_dir=args.run_dir,
        resume="auto",
        strategy=args.strategy,
    )
    with n:  # closes the process group the handle made
        n.train()
        if n.dist.main:
            row = n.history[-1] if n.history else {}
            print(f"{n.dist.describe()}: epoch {n.epoch}, val {row.get('val')}")


if __name__ == "__main__":
    main()
