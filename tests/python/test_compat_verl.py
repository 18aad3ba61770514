"""packsched.compat.verl: verl's signatures and return conventions, with capped plans."""

import json
import math
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

from packsched.compat import openrlhf
from packsched.compat.verl import get_reverse_idx, rearrange_micro_batches, restore_dynamic_batch

HELPERS = pathlib.Path(__file__).parent / "helpers"


def make_batch(lengths, container=dict):
    """A verl-shaped batch: right-padded attention_mask [B, S] and per-row tensors."""
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return container(
        attention_mask=mask,
        input_ids=torch.randint(0, 1000, mask.shape),
        advantages=torch.randn(len(lengths)),
    )


class TensorDictLike(dict):
    """The part of tensordict.TensorDict that verl's batches use here: batch_size, device and
    indexing by a tensor of rows (selects them in every entry)."""

    @property
    def batch_size(self):
        return torch.Size([next(iter(self.values())).shape[0]])

    @property
    def device(self):
        return next(iter(self.values())).device

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(key)
        return TensorDictLike({k: v[key] for k, v in self.items()})


@pytest.mark.parametrize("container", [dict, TensorDictLike])
def test_returns_verl_structure_and_restores(container):
    lengths = [int(x) for x in torch.randint(1, 900, (37,), generator=torch.Generator().manual_seed(3))]
    batch = make_batch(lengths, container)
    micro_batches, idx = rearrange_micro_batches(batch, max_token_len=2048)
    assert len(micro_batches) == len(idx)
    assert sorted(i for mb in idx for i in mb) == list(range(len(lengths)))
    for mb, rows in zip(micro_batches, idx):
        assert type(mb) is container
        assert set(mb.keys()) == set(batch.keys())
        assert torch.equal(mb["input_ids"], batch["input_ids"][rows])
        assert int(mb["attention_mask"].sum()) <= 2048
    outputs = torch.cat([mb["advantages"] * 3 for mb in micro_batches])
    assert torch.equal(restore_dynamic_batch(outputs, idx), batch["advantages"] * 3)


def test_a_batch_where_ceil_total_over_cap_is_infeasible_stays_within_the_cap():
    # Three sequences of 6 tokens under a cap of 10: ceil(18 / 10) = 2 micro-batches, as verl
    # picks, must put two sequences (12 tokens) together. packsched needs and uses 3.
    lengths = [6, 6, 6]
    micro_batches, _ = rearrange_micro_batches(make_batch(lengths), max_token_len=10)
    assert math.ceil(sum(lengths) / 10) == 2
    assert [int(mb["attention_mask"].sum()) for mb in micro_batches] == [6, 6, 6]


def test_options_map_to_the_planner():
    batch = make_batch([100] * 10)
    micro_batches, _ = rearrange_micro_batches(batch, 1000, min_num_micro_batch=3,
                                               num_batches_divided_by=4)
    assert len(micro_batches) == 4
    unordered, idx = rearrange_micro_batches(batch, 250, use_dynamic_bsz_balance=False)
    assert [mb[0] for mb in idx] == sorted(mb[0] for mb in idx)


def test_get_reverse_idx_inverts_a_permutation():
    perm = [3, 0, 2, 1]
    reverse = get_reverse_idx(perm)
    assert [perm[reverse[i]] for i in range(4)] == [0, 1, 2, 3]


def test_openrlhf_drop_ins():
    assert openrlhf.get_minimum_num_micro_batch_size([6, 6, 6], 10, 1, 1) == 3
    assert openrlhf.get_minimum_num_micro_batch_size([6, 6, 6], 6, 2, 1) == 2
    with pytest.raises(ValueError, match="12"):
        openrlhf.get_minimum_num_micro_batch_size([12, 1], 10, 1, 1)
    parts = openrlhf.get_seqlen_balanced_partitions([5, 3, 7, 2, 6, 1], 3, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(p == sorted(p) and len(p) == 2 for p in parts)
    with pytest.raises(ValueError, match="empty"):
        openrlhf.get_seqlen_balanced_partitions([1, 2], 3, equal_size=False)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_of_a_dp_group_agree_on_the_count():
    # Rank 0 has a light batch, rank 1 a heavy one: both must run rank 1's count.
    per_rank = [[100] * 4, [900] * 12]
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "verl_dp_rank.py"), str(r), "2", str(port), "2000",
             ",".join(map(str, lengths))],
            stdout=subprocess.PIPE, text=True, env=env)
        for r, lengths in enumerate(per_rank)
    ]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    heavy_k = math.ceil(12 * 900 / 2000)  # 6 parts of 2 x 900 each fit 2000 exactly
    assert [r["num_micro_batches"] for r in results] == [heavy_k, heavy_k]
    assert all(t <= 2000 for r in results for t in r["tokens"])
    assert sum(results[0]["tokens"]) == 400 and results[0]["tokens"].count(0) == heavy_k - 4


def test_a_realistic_rl_batch_where_verls_partition_breaks_the_cap():
    # Input: gen_lengths.py's realistic RL mix, n = 512, seed 3, cap 16,384 (verl's default
    # ppo_max_token_len_per_gpu). verl's formulation — Karmarkar-Karp into k = ceil(total / cap)
    # parts (the plain-Python baseline of tests/bench/compare_verl.py) — leaves micro-batches of
    # several sequences over the cap; the drop-in leaves none.
    bench = pathlib.Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    from compare_verl import python_kk
    from gen_lengths import realistic_rl_lengths

    lengths = [min(x, 16384) for x in realistic_rl_lengths(512, 3)]
    k = math.ceil(sum(lengths) / 16384)
    verl_over = [p for p in python_kk(lengths, k) if sum(lengths[i] for i in p) > 16384]
    assert len(verl_over) > 0
    micro_batches, _ = rearrange_micro_batches(make_batch(lengths), max_token_len=16384)
    assert all(int(mb["attention_mask"].sum()) <= 16384 for mb in micro_batches)
    assert len(micro_batches) > k


def test_through_a_sidecar_each_call_is_the_next_round(tmp_path):
    from packsched.client import SchedulerClient
    from packsched.compat import verl
    from sidecar import Sidecar

    lengths = [300, 900, 1200, 40, 700, 1500]
    local, _ = rearrange_micro_batches(make_batch(lengths), 2048)
    with Sidecar(tmp_path) as s, SchedulerClient(s.target) as client:
        verl.use_sidecar(client, stream="actor", first_round=10)
        try:
            for _ in range(3):
                remote, idx = rearrange_micro_batches(make_batch(lengths), 2048)
                assert [int(mb["attention_mask"].sum()) for mb in remote] == [
                    int(mb["attention_mask"].sum()) for mb in local]
        finally:
            verl.use_sidecar(None)
        streams = {st["name"]: st for st in client.status()["streams"]}
    assert int(streams["actor"]["last_round"]) == 12
