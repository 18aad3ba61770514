"""packsched.compat.verl: verl's signatures and return conventions, with capped plans."""

import json
import math
import os
import pathlib
import random
import socket
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from packsched import planner
from packsched.compat import openrlhf, verl
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


def tensordict(**entries):
    """A tensordict.TensorDict (verl's DataProto.batch) of per-row ``entries``."""
    return TensorDict(entries, batch_size=[len(next(iter(entries.values())))])


@pytest.mark.parametrize("container", [dict, TensorDictLike, tensordict])
def test_returns_verl_structure_and_restores(container):
    lengths = [
        int(x) for x in torch.randint(1, 900, (37,), generator=torch.Generator().manual_seed(3))
    ]
    batch = make_batch(lengths, container)
    micro_batches, idx = rearrange_micro_batches(batch, max_token_len=2048)
    assert len(micro_batches) == len(idx)
    assert sorted(i for mb in idx for i in mb) == list(range(len(lengths)))
    for mb, rows in zip(micro_batches, idx):
        assert type(mb) is (TensorDict if container is tensordict else container)
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
    micro_batches, _ = rearrange_micro_batches(
        batch, 1000, min_num_micro_batch=3, num_batches_divided_by=4
    )
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


def run_dp_ranks(per_rank, cap, timeout=120, dp_group="world"):
    """Runs helpers/verl_dp_rank.py once per rank (a gloo group on loopback); returns each rank's
    JSON line and exit status. A rank still running after ``timeout`` s fails the test (a hang).
    ``dp_group``: "world" or "none" (what each rank passes as dp_group)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HELPERS / "verl_dp_rank.py"),
                str(r),
                str(len(per_rank)),
                str(port),
                str(cap),
                ",".join(map(str, lengths)),
                dp_group,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r, lengths in enumerate(per_rank)
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        pytest.fail(f"a DP rank was still waiting after {timeout} s")
    return [json.loads(out) for out in outputs], [p.returncode for p in procs]


def test_ranks_of_a_dp_group_agree_on_the_count():
    # Rank 0 has a light batch, rank 1 a heavy one: both must run rank 1's count.
    per_rank = [[100] * 4, [900] * 12]
    results, codes = run_dp_ranks(per_rank, 2000)
    assert codes == [0, 0]
    heavy_k = math.ceil(12 * 900 / 2000)  # 6 parts of 2 x 900 each fit 2000 exactly
    assert [r["num_micro_batches"] for r in results] == [heavy_k, heavy_k]
    assert all(t <= 2000 for r in results for t in r["tokens"])
    assert sum(results[0]["tokens"]) == 400 and results[0]["tokens"].count(0) == heavy_k - 4


def test_dp_group_none_synchronises_nothing_as_verl_does():
    # verl all-reduces the count only over a given dp_group: with None each rank keeps its own
    # count (here 1 and 6) and none waits on a collective.
    results, codes = run_dp_ranks([[100] * 4, [900] * 12], 2000, timeout=120, dp_group="none")
    assert codes == [0, 0], results
    assert [r["num_micro_batches"] for r in results] == [1, math.ceil(12 * 900 / 2000)]


def test_a_rank_with_an_empty_batch_joins_the_count_and_gets_empty_micro_batches():
    results, codes = run_dp_ranks([[], [900] * 12], 2000, timeout=120)
    assert codes == [0, 0], results
    heavy_k = math.ceil(12 * 900 / 2000)
    assert [r["num_micro_batches"] for r in results] == [heavy_k, heavy_k]
    assert results[0]["rows"] == [0] * heavy_k


def test_a_rank_that_cannot_plan_makes_every_rank_fail_instead_of_hanging():
    # Rank 0's second row has no token: its planner raises. It must still join the all-reduce
    # so rank 1 learns of it and raises too.
    results, codes = run_dp_ranks([[100, 0, 50], [900] * 4], 2000, timeout=120)
    assert codes == [1, 1], results
    assert results[0]["error"].startswith("ValueError") and "lengths[1] = 0" in results[0]["error"]
    for other in results[1:]:
        assert other["error"].startswith("RuntimeError"), other
        assert "rank 0" in other["error"]


def test_a_realistic_rl_batch_where_verls_partition_breaks_the_cap():
    # Input: gen_lengths.py's realistic RL mix, n = 512, seed 3, cap 16,384 (verl's default
    # ppo_max_token_len_per_gpu). verl's formulation — Karmarkar-Karp into k = ceil(total / cap)
    # parts (the plain-Python baseline of deploy/verl_kk.py) — leaves micro-batches of
    # several sequences over the cap; the drop-in leaves none.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "deploy"))
    from gen_lengths import realistic_rl_lengths
    from verl_kk import python_kk

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
                    int(mb["attention_mask"].sum()) for mb in local
                ]
        finally:
            verl.use_sidecar(None)
        streams = {st["name"]: st for st in client.status()["streams"]}
    assert int(streams["actor"]["last_round"]) == 12


def verl_order(parts, lengths):
    """verl's placement with use_dynamic_bsz_balance (verl/utils/seqlen_balancing.py,
    rearrange_micro_batches): parts sorted by (workload, first index), largest first; then every
    other one from the first, reversed, followed by the remaining ones."""

    def workload(part):
        return sum(24576 * lengths[i] + lengths[i] ** 2 for i in part)

    ranked = sorted(parts, key=lambda part: (workload(part), part[0] if part else 0), reverse=True)
    return ranked[::2][::-1] + ranked[1::2]


def test_dynamic_bsz_balance_orders_micro_batches_as_verl_small_at_both_ends():
    rng = random.Random(11)
    parities = set()
    for trial in range(12):
        lengths = [rng.randint(20, 2000) for _ in range(rng.randint(8, 60))]
        cap = rng.choice([2048, 3000, 4096])
        _, idx = rearrange_micro_batches(make_batch(lengths), cap)
        parities.add(len(idx) % 2)
        assert idx == verl_order(idx, lengths), (trial, len(idx))
        if len(idx) >= 3:  # the largest workload is inside, never at an end
            loads = [sum(24576 * lengths[i] + lengths[i] ** 2 for i in part) for part in idx]
            assert loads.index(max(loads)) not in (0, len(loads) - 1)
    assert parities == {0, 1}  # both the odd (interleave as is) and the even (mirrored) case


def test_dynamic_bsz_balance_worked_examples():
    # One sequence per micro-batch. verl: sort largest first, then [::2] reversed + [1::2].
    # Four parts 400 > 300 > 200 > 100 -> [200, 400, 300, 100]; five 500..100 ->
    # [100, 300, 500, 400, 200].
    _, idx = rearrange_micro_batches(make_batch([100, 200, 300, 400]), 1000, min_num_micro_batch=4)
    assert idx == [[1], [3], [2], [0]]
    _, idx = rearrange_micro_batches(
        make_batch([100, 200, 300, 400, 500]), 1000, min_num_micro_batch=5
    )
    assert idx == [[0], [2], [4], [3], [1]]


def test_through_a_sidecar_a_failed_round_does_not_hold_back_the_next_call(tmp_path):
    # The peers of a round finished it (here: another caller of the same sidecar, with other
    # content) while this rank's call failed: its next call must be the next round, not a resend.
    from packsched.client import SchedulerClient, SchedulerError
    from sidecar import Sidecar

    with Sidecar(tmp_path) as s, SchedulerClient(s.target) as client:
        client.plan(20, [5, 5], 2048, stream="actor")
        verl.use_sidecar(client, stream="actor", first_round=20)
        try:
            with pytest.raises(SchedulerError) as e:
                rearrange_micro_batches(make_batch([300, 900]), 2048)
            assert e.value.code == "FAILED_PRECONDITION"
            micro_batches, _ = rearrange_micro_batches(make_batch([300, 900, 1200]), 2048)
            assert sum(int(mb["attention_mask"].sum()) for mb in micro_batches) == 2400
        finally:
            verl.use_sidecar(None)
        streams = {st["name"]: st for st in client.status()["streams"]}
    assert int(streams["actor"]["last_round"]) == 21


def test_verl_and_openrlhf_seqlen_balanced_partitions_keep_verls_contract():
    rng = random.Random(4)
    for _ in range(30):
        lengths = [rng.randint(1, 5000) for _ in range(rng.randint(1, 40))]
        k = rng.randint(1, len(lengths))
        for module in (verl, openrlhf):
            parts = module.get_seqlen_balanced_partitions(lengths, k, equal_size=False)
            # verl's contract: exactly k non-empty parts, each sorted, covering every index once.
            assert len(parts) == k
            assert all(part and part == sorted(part) for part in parts)
            assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
            if len(lengths) % k == 0:
                equal = module.get_seqlen_balanced_partitions(lengths, k, equal_size=True)
                assert [len(part) for part in equal] == [len(lengths) // k] * k


def test_openrlhf_count_then_partition_keeps_the_capacity():
    # OpenRLHF calls get_minimum_num_micro_batch_size, then get_seqlen_balanced_partitions with
    # that count and no cap. The pair must keep every micro-batch within the capacity.
    rng = random.Random(5)
    uncapped_over = 0
    for _ in range(300):
        cap = rng.choice([1000, 4096, 16384])
        lengths = [
            min(cap, max(1, int(rng.lognormvariate(math.log(cap / 6), 1.0))))
            for _ in range(rng.randint(2, 120))
        ]
        k = openrlhf.get_minimum_num_micro_batch_size(lengths, cap, 1, 1)
        if k > len(lengths):
            continue
        parts = openrlhf.get_seqlen_balanced_partitions(lengths, k, False)
        assert max(sum(lengths[i] for i in part) for part in parts) <= cap
        plain = planner.partition(lengths, k)  # the same k with no cap: balance only
        uncapped_over += any(meta.tokens > cap for meta in plain.metadata)
    assert uncapped_over > 0  # without the remembered capacity the pair would break the cap


def test_openrlhf_partition_of_other_lengths_applies_no_remembered_capacity():
    assert openrlhf.get_minimum_num_micro_batch_size([6, 6, 6], 10, 1, 1) == 3
    # Other lengths: balance only (two parts of 12 tokens are fine, no cap of 10 applies).
    parts = openrlhf.get_seqlen_balanced_partitions([6, 6, 6, 6], 2, False)
    assert sorted(len(part) for part in parts) == [2, 2]
    # The same lengths with fewer parts than the count: the caller's choice, no error.
    assert len(openrlhf.get_seqlen_balanced_partitions([6, 6, 6], 2, False)) == 2


class DataProtoLike:
    """The part of verl.protocol.DataProto that prepare_dynamic_batch uses: batch (tensors on dim
    0), non_tensor_batch (numpy object arrays), meta_info, and from_dict."""

    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    @classmethod
    def from_dict(cls, tensors, non_tensors=None, meta_info=None):
        return cls(TensorDictLike(tensors), non_tensors or {}, meta_info or {})


def test_prepare_dynamic_batch_splits_tensors_non_tensors_and_copies_meta_info():
    import numpy as np

    lengths = [300, 900, 1200, 40, 700, 1500, 60]
    batch = make_batch(lengths, TensorDictLike)
    uids = np.array([f"uid{i}" for i in range(len(lengths))], dtype=object)
    data = DataProtoLike(batch, {"uid": uids}, {"temperature": 0.7, "nested": {"a": [1]}})
    protos, idx = verl.prepare_dynamic_batch(data, 2048)
    _, expected_idx = rearrange_micro_batches(batch, 2048)
    assert idx == expected_idx
    for proto, rows in zip(protos, idx):
        assert type(proto) is DataProtoLike
        assert torch.equal(proto.batch["input_ids"], batch["input_ids"][rows])
        assert list(proto.non_tensor_batch["uid"]) == [f"uid{i}" for i in rows]
        assert proto.meta_info == data.meta_info and proto.meta_info is not data.meta_info
        assert proto.meta_info["nested"] is not data.meta_info["nested"]  # a deep copy


def test_through_a_sidecar_set_global_step_numbers_rounds_from_the_step(tmp_path):
    from packsched.client import SchedulerClient
    from sidecar import Sidecar

    with Sidecar(tmp_path) as s, SchedulerClient(s.target) as client:
        verl.use_sidecar(client, stream="actor", calls_per_step=2)
        try:
            verl.set_global_step(7)
            for _ in range(2):
                rearrange_micro_batches(make_batch([300, 900]), 2048)
            with pytest.raises(ValueError, match="more than calls_per_step = 2"):
                rearrange_micro_batches(make_batch([300, 900]), 2048)
            assert int(client.status()["streams"][0]["last_round"]) == 15  # 7 * 2 + 1
            verl.set_global_step(9)
            rearrange_micro_batches(make_batch([300, 900]), 2048)
        finally:
            verl.use_sidecar(None)
        streams = {st["name"]: st for st in client.status()["streams"]}
    assert int(streams["actor"]["last_round"]) == 18
    verl.set_global_step(3)  # without a sidecar: nothing to number
    with pytest.raises(ValueError, match="calls_per_step is 0"):
        verl.use_sidecar(object(), calls_per_step=0)
