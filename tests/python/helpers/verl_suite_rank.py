"""One rank of verl's distributed seqlen-balancing test, against packsched.compat.verl.

Usage: verl_suite_rank.py RANK WORLD_SIZE PORT MAX_TOKEN_LEN SAME_MICRO_NUM(0|1) MIN_MB(-|int)
Builds the rank's batch as verl's test does (20 + 5·rank rows of 100, seed 42 + rank, random
left padding up to 10% and 50–90% valid tokens), calls rearrange_micro_batches over a gloo group,
gathers every rank's verl count, checks the concat-reverse reconstruction, and prints one JSON
line: {"rank", "micro_batches", "verl_local", "verl_all", "tokens", "lengths", "restored"}.
"""

import json
import sys

import torch
import torch.distributed as dist

from packsched.compat.verl import ceildiv, get_reverse_idx, rearrange_micro_batches


def random_mask(rows, width, generator, max_left=0.1, min_valid=0.5, max_valid=0.9):
    """Left padding of up to max_left·width, then between min_valid and max_valid·width ones."""
    mask = torch.zeros(rows, width, dtype=torch.int64)
    for row in range(rows):
        left = int(torch.randint(0, int(max_left * width) + 1, (1,), generator=generator))
        valid = int(
            torch.randint(
                int(min_valid * width), int(max_valid * width) + 1, (1,), generator=generator
            )
        )
        mask[row, left : min(width, left + valid)] = 1
    return mask


def main():
    rank, world_size, port, cap, same = (int(x) for x in sys.argv[1:6])
    min_mb = None if sys.argv[6] == "-" else int(sys.argv[6])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        generator = torch.Generator().manual_seed(42 + rank)
        rows = 20 + rank * 5
        input_ids = torch.randint(0, 10, (rows, 100), generator=generator)
        batch = {"input_ids": input_ids, "attention_mask": random_mask(rows, 100, generator)}
        micros, idx_lst = rearrange_micro_batches(
            batch,
            max_token_len=cap,
            dp_group=dist.group.WORLD,
            same_micro_num_in_dp=bool(same),
            min_num_micro_batch=min_mb,
        )
        lengths = batch["attention_mask"].sum(dim=1)
        local = min(len(lengths), ceildiv(int(lengths.sum()), cap))
        counts = [torch.zeros(1) for _ in range(world_size)]
        dist.all_gather(counts, torch.tensor([float(local)]))
        flat = {key: torch.cat([mb[key] for mb in micros]) for key in batch}
        order = get_reverse_idx(torch.tensor([i for sub in idx_lst for i in sub]))
        restored = all(torch.equal(flat[key][order], batch[key]) for key in batch)
    finally:
        dist.destroy_process_group()
    print(
        json.dumps(
            {
                "rank": rank,
                "micro_batches": len(micros),
                "verl_local": local,
                "verl_all": [int(c.item()) for c in counts],
                "tokens": [int(mb["attention_mask"].sum()) for mb in micros],
                "lengths": lengths.tolist(),
                "restored": restored,
            }
        )
    )


if __name__ == "__main__":
    from rank_exit import run

    run(main)
