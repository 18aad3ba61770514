"""The keyword options shared by ``SchedulerClient.plan``, ``packsched.planner`` and the CLI.

One table of names and defaults (the documented ones of the C++ ``PlanOptions`` and
``LossOptions``), so the sidecar client and the in-process planner take the same keywords and give
the same plan for the same input. Values are not validated here: the planner judges them (the
sidecar answers INVALID_ARGUMENT, the in-process planner raises ValueError) with one message.
"""

# Planner options: names as in proto/packsched/v1 and `packsched plan --help`.
PLAN_DEFAULTS = {
    "max_token_len": None,  # tokens per micro-batch (see cap_mode); None = no cap (fixed k only)
    "max_seqs_per_micro_batch": None,  # None = unlimited
    "min_micro_batches": 1,
    "divisible_by": 1,  # the count is a multiple of this (pipeline parallelism)
    "align_to": 1,  # each sequence padded to a multiple (e.g. 2*tp*cp)
    "align_total_to": 1,  # each micro-batch's total padded to a multiple
    "cap_mode": "tokens",  # "tokens" | "padded"
    "algorithm": "kk",  # "kk" | "lpt" | "ffd" | "bfd" | "sequential"
    "cost": "tokens",  # "tokens" | "attention"
    "attention_cost": None,  # (a, b): cost = a*L + b*L^2; None = the documented default
    "overlong": "reject",  # "reject" | "isolate" | "drop"
    "order": "cost_desc",  # "cost_desc" | "index" | "interleave"
    "max_micro_batches": 1_000_000,
    "equal_size": False,  # fixed k only: n / k sequences per micro-batch
    "same_micro_num_in_dp": True,  # sidecar rounds: False keeps each rank's own count
}

# Loss-weight options (see DESIGN.md §2, "Loss weights").
LOSS_DEFAULTS = {
    "loss_tokens": None,  # per sequence: tokens whose label is not ignore_index; None = no weights
    "loss_mode": "token_mean",  # "token_mean" | "sample_mean" | "seq_sum" | "sum" | "sum_norm"
    "dp_reduction": "sum",  # "sum" | "mean" (gradients averaged over DP ranks)
    "sum_norm_constant": 1.0,  # C of "sum_norm"
}


def split_options(max_token_len, options, *, where):
    """Returns (plan options, loss options) with every default filled in.

    ``options`` are the caller's keyword arguments; an unknown name raises TypeError naming it and
    ``where`` (the function), as Python does for a bad keyword.
    """
    unknown = sorted(set(options) - set(PLAN_DEFAULTS) - set(LOSS_DEFAULTS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(unknown)}")
    plan = {name: options.get(name, default) for name, default in PLAN_DEFAULTS.items()}
    plan["max_token_len"] = max_token_len
    loss = {name: options.get(name, default) for name, default in LOSS_DEFAULTS.items()}
    return plan, loss
