"""Dynamic context parallelism in-process: each sequence of a step on the CP group size it needs.

``dynamic_cp(seq_lens, ranks, max_tokens_per_rank, ...)`` plans one step over a domain of
``ranks`` = dp x cp_max ranks (docs/design.md, "Dynamic context parallelism"): per micro-batch
slot, the ranks split into CP groups of consecutive ranks (sizes from ``sizes``: "powers_of_two",
"divisors" of ranks, or "any", within [min_cp, max_cp]); each group runs one packed micro-batch
whose sequences are aligned to 2 * c * tensor_parallel and sharded head-tail over its c ranks
(``packsched.kernels.cp_shard`` with cp = c and rank = the rank's index in its group). Every rank
holds at most ``max_tokens_per_rank`` rows of a micro-batch; a sequence runs exactly once.

The cost is either the model's (``model_config``: a Hugging Face style config dict or path, with
``flops_per_byte`` = the device's FLOP/s over a link's bytes/s within a node of ``node_ranks``
ranks and ``flops_per_byte_across_nodes`` beyond it) or given by hand (``cost`` = (linear,
quadratic, comm, micro_batch, node_ranks, comm_across_nodes)). ValueError with the planner's
message on bad input (naming the sequence or option).
"""

from dataclasses import dataclass

from . import _planner
from .model_cost import model_fields

SIZES = ("powers_of_two", "divisors", "any")


@dataclass(frozen=True)
class RankMicroBatch:
    """What one rank runs in one slot: its CP group (``group``: the ranks, ``group_name``: the
    same name wherever the same ranks form a group, so one process group per name suffices),
    its index in the group (``cp_rank``: the ``rank`` of cp_shard, cp = len(group)), the
    group's sequences (input indices), its aligned ``cu_seqlens`` (int32 offsets; lengths
    multiples of 2 * cp * tp) and the sequences' loss weights (empty without ``loss_tokens``).
    An idle group has no sequences."""

    slot: int
    group: tuple
    group_name: int
    cp_rank: int
    sequences: tuple
    cu_seqlens: tuple
    loss_weights: tuple

    @property
    def cp(self):
        return len(self.group)


class DynamicCpPlan:
    """The plan of one step: ``slots`` (per slot its groups, dicts of first_rank, size, name,
    sequences, cu_seqlens, tokens_per_rank and cost), ``group_names`` ((first_rank, size) per
    name), ``cp_of_sequence``, ``slot_of_sequence``, ``step_cost`` (sum over slots of the
    costliest group), ``lower_bound`` (no plan is cheaper), ``comm_tokens`` (sum of L * (c - 1)),
    ``cost_model`` (the weights used) and ``loss_weights`` (per sequence, when asked)."""

    def __init__(self, raw):
        self.slots = raw["slots"]
        self.group_names = [tuple(g) for g in raw["group_names"]]
        self.cp_of_sequence = list(raw["cp_of_sequence"])
        self.slot_of_sequence = list(raw["slot_of_sequence"])
        self.step_cost = int(raw["step_cost"])
        self.lower_bound = int(raw["lower_bound"])
        self.comm_tokens = int(raw["comm_tokens"])
        self.cost_model = tuple(raw["cost_model"])
        self.loss_weights = list(raw.get("loss_weights", []))

    @property
    def num_micro_batches(self):
        return len(self.slots)

    def for_rank(self, rank):
        """Rank ``rank``'s micro-batch in every slot, in slot order (RankMicroBatch)."""
        out = []
        for i, slot in enumerate(self.slots):
            for g in slot["groups"]:
                first, size = g["first_rank"], g["size"]
                if first <= rank < first + size:
                    seqs = tuple(g["sequences"])
                    weights = tuple(self.loss_weights[s] for s in seqs) if self.loss_weights else ()
                    out.append(
                        RankMicroBatch(
                            slot=i,
                            group=tuple(range(first, first + size)),
                            group_name=g["name"],
                            cp_rank=rank - first,
                            sequences=seqs,
                            cu_seqlens=tuple(g["cu_seqlens"]),
                            loss_weights=weights,
                        )
                    )
                    break
            else:
                raise ValueError(f"rank {rank} is in no group of slot {i} (ranks: {self.ranks})")
        return out

    @property
    def ranks(self):
        return sum(g["size"] for g in self.slots[0]["groups"]) if self.slots else 0


def dynamic_cp(
    seq_lens,
    ranks,
    max_tokens_per_rank,
    *,
    sizes="powers_of_two",
    min_cp=1,
    max_cp=0,
    tensor_parallel=1,
    divisible_by=1,
    model_config=None,
    flops_per_byte=1000.0,
    flops_per_byte_across_nodes=8000.0,
    node_ranks=8,
    bytes_per_element=2,
    cost=None,
    loss_tokens=None,
    loss_mode="token_mean",
    dp_reduction="sum",
    sum_norm_constant=1.0,
):
    """Plans one step (see the module docstring); returns a DynamicCpPlan. ``max_cp`` = 0 means
    ``ranks``; ``divisible_by`` makes the slot count a multiple (pipeline stages); with
    ``loss_tokens`` (per sequence, the tokens with a label) the plan carries the per-sequence loss
    weights of ``loss_mode`` (token_mean, sample_mean, seq_sum, sum, sum_norm), ``dp_reduction``
    "mean" multiplying them by ``ranks``. Without ``model_config`` and ``cost`` the cost is the
    tokens (linear 1)."""
    if sizes not in SIZES:
        raise ValueError(f"sizes must be one of {SIZES}, got {sizes!r}")
    lengths = [int(v) for v in seq_lens]
    options = {
        "ranks": int(ranks),
        "max_tokens_per_rank": int(max_tokens_per_rank),
        "sizes": sizes,
        "min_cp": int(min_cp),
        "max_cp": int(max_cp),
        "tensor_parallel": int(tensor_parallel),
        "divisible_by": int(divisible_by),
    }
    model = None
    if model_config is not None:
        if cost is not None:
            raise ValueError("give model_config or cost, not both")
        ints, strings = model_fields(model_config)
        model = {
            "ints": ints,
            "strings": strings,
            "flops_per_byte": float(flops_per_byte),
            "flops_per_byte_across_nodes": float(flops_per_byte_across_nodes),
            "node_ranks": int(node_ranks),
            "bytes_per_element": int(bytes_per_element),
        }
    elif cost is None:
        cost = (1, 0, 0, 0, 0, 0)
    loss = None
    if loss_tokens is not None:
        loss = {
            "loss_tokens": [int(v) for v in loss_tokens],
            "loss_mode": loss_mode,
            "dp_reduction": dp_reduction,
            "sum_norm_constant": float(sum_norm_constant),
        }
    raw = _planner.dynamic_cp(
        lengths, options, None if cost is None else [int(v) for v in cost], model, loss
    )
    return DynamicCpPlan(raw)
