"""The keyword options shared by ``SchedulerClient``, ``packsched.planner`` and the CLI.

One table of names and defaults (the documented ones of the C++ ``PlanOptions`` and
``LossOptions``), so the sidecar client and the in-process planner take the same keywords and give
the same plan for the same input, and one check of the option values (``split_options``), so both
reject a bad value the same way before anything runs: ValueError naming the option and the value.
The check covers what the wire could not carry faithfully (names outside the vocabulary, a zero
that the proto would read as "the default", non-integers); limits that depend on the planner
(upper bounds, the sequences themselves) stay with the planner, which answers with its own message
(the sidecar as INVALID_ARGUMENT, the in-process planner as ValueError).
"""

import operator

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


# The names each enum-valued option accepts (the planner's vocabulary, spelled as in the CLI).
CHOICES = {
    "cap_mode": ("tokens", "padded"),
    "algorithm": ("kk", "lpt", "ffd", "bfd", "sequential"),
    "cost": ("tokens", "attention"),
    "overlong": ("reject", "isolate", "drop"),
    "order": ("cost_desc", "index", "interleave"),
    "loss_mode": ("token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"),
    "dp_reduction": ("sum", "mean"),
}
# The sidecar balances k micro-batches only; dataset packing (ffd, bfd, sequential) runs
# in-process (packsched.planner.plan_local) or in `packsched plan`.
SIDECAR_ALGORITHMS = ("kk", "lpt")

# Integer options and the smallest value checked here: those whose 0 the proto reads as "the
# default" must be >= 1 on both paths; the others' ranges are the planner's to judge.
_MINIMUM = {
    "max_token_len": None,  # None = no cap (fixed k only); 0 on the wire
    "max_seqs_per_micro_batch": None,  # None = unlimited; 0 on the wire
    "min_micro_batches": 1,
    "divisible_by": 1,
    "align_to": 1,
    "align_total_to": 1,
    "max_micro_batches": 1,
}


def split_options(max_token_len, options, *, where, cap_required=False, sidecar=False):
    """Returns (plan options, loss options) with every default filled in and every value checked.

    ``options`` are the caller's keyword arguments; an unknown name raises TypeError naming it and
    ``where`` (the function), as Python does for a bad keyword. A bad value raises ValueError
    naming the option and the value: a name outside ``CHOICES`` (case matters), an integer option
    that is not an integer or is below its smallest valid value, ``max_token_len=None`` where
    ``cap_required``. ``sidecar``: the call goes to the sidecar, which balances with kk or lpt only.
    Integer values come back as Python ints (numpy integers are accepted).
    """
    unknown = sorted(set(options) - set(PLAN_DEFAULTS) - set(LOSS_DEFAULTS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(unknown)}")
    plan = {name: options.get(name, default) for name, default in PLAN_DEFAULTS.items()}
    plan["max_token_len"] = max_token_len
    loss = {name: options.get(name, default) for name, default in LOSS_DEFAULTS.items()}
    if cap_required and max_token_len is None:
        raise ValueError(
            f"{where}: max_token_len is required (the cap per micro-batch, in " "tokens), got None"
        )
    for name, minimum in _MINIMUM.items():
        if plan[name] is not None or PLAN_DEFAULTS[name] is not None:
            plan[name] = _integer(name, plan[name], minimum)
    for name, choices in CHOICES.items():
        _choice(name, plan[name] if name in plan else loss[name], choices)
    if sidecar and plan["algorithm"] not in SIDECAR_ALGORITHMS:
        raise ValueError(
            f"algorithm {plan['algorithm']!r} is not one of {', '.join(SIDECAR_ALGORITHMS)} "
            "(the sidecar balances micro-batches; dataset packing with ffd, bfd or sequential "
            "runs in-process: packsched.planner.plan_local or `packsched plan`)"
        )
    if plan["attention_cost"] is not None:
        cost = plan["attention_cost"]
        if isinstance(cost, (str, bytes)) or not hasattr(cost, "__len__") or len(cost) != 2:
            raise ValueError(f"attention_cost = {cost!r}: must be a pair (a, b) of integers")
        plan["attention_cost"] = tuple(_integer("attention_cost", x, 0, shown=cost) for x in cost)
    for name in ("equal_size", "same_micro_num_in_dp"):
        if plan[name] not in (True, False):
            raise ValueError(f"{name} = {plan[name]!r}: must be True or False")
        plan[name] = bool(plan[name])
    return plan, loss


def check_world_size(where, global_counts, world_size):
    """``world_size`` (the DP ranks the loss counts were summed over) needs those counts: without
    ``global_counts`` the weights use this rank's own counts, which only a world of 1 sums to."""
    size = _integer("world_size", world_size, 1)
    if global_counts is None and size != 1:
        raise ValueError(
            f"{where}: world_size = {size} needs global_counts (the loss tokens and sequences with "
            "loss summed over those ranks); without them the loss weights use this rank's own "
            "counts, world size 1"
        )
    return size


def _integer(name, value, minimum, *, shown=None):
    shown = value if shown is None else shown
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {shown!r}: must be an integer") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} = {shown!r}: must be >= {minimum}")
    return number


def _choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(choices)}")
