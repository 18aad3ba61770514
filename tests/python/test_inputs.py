"""One check of the per-sequence data for SchedulerClient and the in-process planner.

The same bad ``seq_lens``, ``loss_tokens`` or ``group_ids`` must raise the same exception type
with the same message on both paths (packsched._inputs), before anything is sent; values the
planner refuses get the planner's message on both (ValueError in process, INVALID_ARGUMENT from
the sidecar).
"""

import numpy as np
import pytest
import torch

from packsched import planner
from packsched.client import SchedulerClient, SchedulerError
from sidecar import Sidecar

CAP = 100


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with Sidecar(tmp_path_factory.mktemp("sidecar"), "--max_streams=64") as s:
        with SchedulerClient(s.target, timeout=10) as c:
            yield c


_round = iter(range(10**6))


def in_process(call, seq_lens, **kw):
    return {
        "plan": lambda: planner.plan_local(seq_lens, CAP, **kw),
        "partition": lambda: planner.partition(seq_lens, 2, CAP, **kw),
        "balance": lambda: planner.balance(seq_lens, 2, CAP, **kw),
    }[call]()


def via_client(client, call, seq_lens, **kw):
    return {
        "plan": lambda: client.plan(next(_round), seq_lens, CAP, **kw),
        "partition": lambda: client.partition(seq_lens, 2, CAP, **kw),
        "balance": lambda: client.balance_batch(seq_lens, 2, CAP, **kw),
    }[call]()


def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


BAD_LENGTHS = [
    ([], ValueError, "seq_lens is empty: nothing to plan"),
    (np.array([], dtype=np.int64), ValueError, "seq_lens is empty: nothing to plan"),
    ([True, False], TypeError, "seq_lens[0] = True: must be an integer, not bool"),
    ([3, True], TypeError, "seq_lens[1] = True: must be an integer, not bool"),
    # numpy's own spelling of its bool scalar (np.True_, bool since numpy 2; True, bool_ before).
    (
        [3, np.bool_(True)],
        TypeError,
        f"seq_lens[1] = {np.bool_(True)!r}: must be an integer, "
        f"not {type(np.bool_(True)).__name__}",
    ),
    (np.array([True]), TypeError, "seq_lens must hold integers, got dtype bool"),
    ([4, 2.0], TypeError, "seq_lens[1] = 2.0: must be an integer, not float"),
    (["3"], TypeError, "seq_lens[0] = '3': must be an integer, not str"),
    ([5, None], TypeError, "seq_lens[1] = None: must be an integer, not NoneType"),
    ([[1], [2, 3]], TypeError, "seq_lens[0] = [1]: must be an integer, not list"),
    ([[1, 2], [3, 4]], ValueError, "seq_lens must be one-dimensional, got shape (2, 2)"),
    (None, TypeError, "seq_lens must be a sequence of integers, got NoneType"),
    (7, TypeError, "seq_lens must be a sequence of integers, got int"),
    ("12", TypeError, "seq_lens must be a sequence of integers, got str"),
    (np.array([1.0]), TypeError, "seq_lens must hold integers, got dtype float64"),
    (torch.tensor([1.0]), TypeError, "seq_lens must hold integers, got dtype float32"),
    ([2**63], ValueError, "seq_lens[0] = 9223372036854775808: does not fit in int64"),
    ([1, 2**70], ValueError, "seq_lens[1] = 1180591620717411303424: does not fit in int64"),
    (
        np.array([1, 2**63], dtype=np.uint64),
        ValueError,
        "seq_lens[1] = 9223372036854775808: does not fit in int64",
    ),
]


@pytest.mark.parametrize("call", ["plan", "partition", "balance"])
@pytest.mark.parametrize("seq_lens,kind,message", BAD_LENGTHS)
def test_bad_lengths_raise_the_same_error_on_both_paths(client, call, seq_lens, kind, message):
    if call == "partition" and "empty" in message:
        pytest.skip("partition takes an empty batch (see the test below)")
    local = error_of(lambda: in_process(call, seq_lens))
    remote = error_of(lambda: via_client(client, call, seq_lens))
    assert type(local) is kind and type(remote) is kind
    assert str(local) == str(remote) == message


@pytest.mark.parametrize(
    "loss_tokens,kind,message",
    [
        ([1, True], TypeError, "loss_tokens[1] = True: must be an integer, not bool"),
        ([1, 0.5], TypeError, "loss_tokens[1] = 0.5: must be an integer, not float"),
        (np.ones((2, 1), dtype=np.int64), ValueError, "loss_tokens must be one-dimensional"),
    ],
)
@pytest.mark.parametrize("call", ["plan", "partition"])
def test_bad_loss_tokens_raise_the_same_error_on_both_paths(
    client, call, loss_tokens, kind, message
):
    local = error_of(lambda: in_process(call, [5, 6], loss_tokens=loss_tokens))
    remote = error_of(lambda: via_client(client, call, [5, 6], loss_tokens=loss_tokens))
    assert type(local) is kind and type(remote) is kind
    assert str(local) == str(remote) and str(local).startswith(message)


def test_bad_group_ids_raise_the_same_error_on_both_paths(client):
    local = error_of(lambda: planner.balance([5, 6], 2, CAP, group_ids=[0, False]))
    remote = error_of(lambda: client.balance_batch([5, 6], 2, CAP, group_ids=[0, False]))
    assert type(local) is type(remote) is TypeError
    assert str(local) == str(remote) == "group_ids[1] = False: must be an integer, not bool"


@pytest.mark.parametrize("seq_lens", [[0, 3], [-1, 3]])
def test_values_the_planner_refuses_get_its_message_on_both_paths(client, seq_lens):
    local = error_of(lambda: planner.plan_local(seq_lens, CAP))
    remote = error_of(lambda: client.plan(next(_round), seq_lens, CAP))
    assert isinstance(local, ValueError)
    assert isinstance(remote, SchedulerError) and remote.code == "INVALID_ARGUMENT"
    assert str(local) in str(remote)


@pytest.mark.parametrize(
    "make",
    [
        lambda: [5, 6, 7],
        lambda: (5, 6, 7),
        lambda: iter([5, 6, 7]),
        lambda: np.array([5, 6, 7], dtype=np.int32),
        lambda: np.array([5, 6, 7], dtype=np.uint16),
        lambda: torch.tensor([5, 6, 7]),
        lambda: [np.int64(5), 6, np.int32(7)],
    ],
    ids=["list", "tuple", "iterator", "int32", "uint16", "torch", "numpy-scalars"],
)
def test_every_accepted_form_gives_the_same_plan_on_both_paths(client, make):
    local = planner.plan_local(make(), CAP)
    remote = client.plan(next(_round), make(), CAP)
    assert (
        local.micro_batches
        == remote.micro_batches
        == planner.plan_local([5, 6, 7], CAP).micro_batches
    )
    assert local.reorder == remote.reorder


def test_an_empty_batch_partitions_into_empty_micro_batches_on_both_paths(client):
    local = planner.partition([], 3, CAP, loss_tokens=[])
    remote = client.partition([], 3, CAP, loss_tokens=[])
    assert local.micro_batches == remote.micro_batches == [[], [], []]
    assert local.empty == remote.empty == [True] * 3
    assert planner.local_bound([], CAP).num_sequences == 0
