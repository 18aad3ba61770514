"""One data-parallel rank calling packsched.compat.verl.rearrange_micro_batches over a gloo group.

Usage: verl_dp_rank.py RANK WORLD_SIZE PORT MAX_TOKEN_LEN LEN,LEN,... [DP_GROUP]
An empty LEN list is an empty batch (0 rows); a 0 is a row without tokens. DP_GROUP: "world"
(the default: dp_group=dist.group.WORLD) or "none" (dp_group=None: verl synchronises nothing).
Prints one JSON line: {"rank", "num_micro_batches", "tokens": [per micro-batch], "rows": [...]},
or {"rank", "error": "ExceptionType: message"} (exit status 1) when the call raised.
"""

import json
import sys

import torch
import torch.distributed as dist

from packsched.compat.verl import rearrange_micro_batches


def main():
    rank, world_size, port, cap = (int(x) for x in sys.argv[1:5])
    lengths = [int(x) for x in sys.argv[5].split(",") if x]
    group_arg = sys.argv[6] if len(sys.argv) > 6 else "world"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    mask = torch.zeros(len(lengths), max(lengths, default=8), dtype=torch.int64)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    batch = {"attention_mask": mask, "input_ids": torch.arange(mask.numel()).reshape(mask.shape)}
    error = None
    try:
        group = dist.group.WORLD if group_arg == "world" else None
        micro_batches, _ = rearrange_micro_batches(batch, max_token_len=cap, dp_group=group)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    # Only now, with the exception and its traceback (whose frames hold the group) gone: destroying
    # the group while they were alive, then exiting, aborted the process at interpreter exit
    # under torch 2.15 (std::terminate, 1 run in 12) instead of exiting with status 1.
    del group
    dist.destroy_process_group()
    if error is not None:
        print(json.dumps({"rank": rank, "error": error}))
        sys.exit(1)
    tokens = [int(mb["attention_mask"].sum()) for mb in micro_batches]
    rows = [int(mb["attention_mask"].shape[0]) for mb in micro_batches]
    print(
        json.dumps(
            {"rank": rank, "num_micro_batches": len(micro_batches), "tokens": tokens, "rows": rows}
        )
    )


if __name__ == "__main__":
    from rank_exit import run

    run(main)
