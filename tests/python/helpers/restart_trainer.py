"""One data-parallel rank of a trainer that plans through its sidecar with the verl drop-in
(tests/python/test_restart.py): every step it calls ``set_global_step(step)`` and then
``rearrange_micro_batches`` twice (a log-prob pass and an update), on a batch that depends on
(data, step, rank, call). One JSON line per step on stdout: {"step", "plans": [micro-batch row
indices per call]}, or {"step", "code", "message"} and exit 3 when a call fails. With
``--stall_at S`` every rank announces {"stalled": S} at the start of step S and sleeps: the test
kills the trainer there.

Usage: restart_trainer.py TARGET RANK FIRST_STEP LAST_STEP DATA STREAM [--stall_at S]
"""

import argparse
import json
import random
import sys
import time

import torch

from packsched.client import SchedulerClient, SchedulerError
from packsched.compat import verl


def batch(data, step, rank, call):
    rng = random.Random(f"{data}/{step}/{rank}/{call}")
    lengths = [rng.randint(50, 3000) for _ in range(rng.randint(8, 24))]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return {"attention_mask": mask}


def main():
    parser = argparse.ArgumentParser()
    for name in ("target", "rank", "first_step", "last_step", "data", "stream"):
        parser.add_argument(name)
    parser.add_argument("--stall_at", type=int)
    args = parser.parse_args()
    rank = int(args.rank)
    with SchedulerClient(args.target, timeout=60) as client:
        verl.use_sidecar(client, stream=args.stream)
        for step in range(int(args.first_step), int(args.last_step)):
            verl.set_global_step(step)
            if step == args.stall_at:
                print(json.dumps({"stalled": step}), flush=True)
                time.sleep(3600)
            plans = []
            for call in range(2):
                try:
                    _, idx = verl.rearrange_micro_batches(batch(args.data, step, rank, call), 4096)
                except SchedulerError as e:
                    print(json.dumps({"step": step, "code": e.code, "message": e.message}))
                    sys.exit(3)
                plans.append(idx)
            print(json.dumps({"step": step, "plans": plans}), flush=True)


if __name__ == "__main__":
    main()
