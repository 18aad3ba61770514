"""The keyword options shared by ``SchedulerClient``, ``packsched.planner`` and the CLI.

One table of names and defaults (the schema table of server/planner/schema.h, through
``packsched._planner.schema()``: the documented defaults of the C++ ``PlanOptions`` and
``LossOptions``), so the sidecar client and the in-process planner take the same keywords and give
the same plan for the same input, and one check of the option values (``split_options``), so both
reject a bad value the same way before anything runs: ValueError naming the option and the value.
The check covers what the wire could not carry faithfully (names outside the vocabulary, a zero
that the proto would read as "the default", non-integers); limits that depend on the planner
(upper bounds, the sequences themselves) stay with the planner, which answers with its own message
(the sidecar as INVALID_ARGUMENT, the in-process planner as ValueError).
"""

import operator

from . import _planner

# The schema table (server/planner/schema.h): names, proto numbers, rules, the planner's defaults
# and the enum vocabularies. Everything below is derived from it.
SCHEMA = _planner.schema()
WEIGHT_PAIR = SCHEMA["weight_pair"]  # the Weight options as one (a, b) keyword
_PLAN_FIELDS = SCHEMA["plan_options"]
_ROUND_FIELDS = SCHEMA["round_options"]
_LOSS_FIELDS = SCHEMA["loss_options"]
# The cap (max_token_len): positional in every entry point, None = no cap (fixed k only).
CAP = next(f["name"] for f in _PLAN_FIELDS if f["rule"] == "Cap")
# Rules whose 0 means "none" on the wire and in the planner: None in Python.
_NONE_RULES = ("Cap", "Unlimited")


def _plan_defaults():
    defaults = {}
    for f in _PLAN_FIELDS:
        if f["rule"] == "Weight":
            defaults[WEIGHT_PAIR] = None  # None = the documented default
        else:
            defaults[f["name"]] = None if f["rule"] in _NONE_RULES else f["default"]
    for f in _ROUND_FIELDS:
        defaults[f["name"]] = f["default"]
    return defaults


# Planner options: names as in proto/packsched/v1 and `packsched plan --help`; defaults as the
# planner's (the CLI's), None where 0 means none; the Weight options as one pair (a, b).
PLAN_DEFAULTS = _plan_defaults()

# Loss-weight options (see docs/design.md §2, "Loss weights"), by their keywords; loss_tokens is the
# request's per-sequence data (None = no weights).
LOSS_DEFAULTS = {"loss_tokens": None, **{f["key"]: f["default"] for f in _LOSS_FIELDS}}

# The names each enum-valued option accepts (the planner's vocabulary, spelled as in the CLI; the
# proto value of a name is its index + 1).
CHOICES = {
    **{f["name"]: tuple(f["choices"]) for f in _PLAN_FIELDS if f["rule"] == "Enum"},
    **{f["key"]: tuple(f["choices"]) for f in _LOSS_FIELDS if f["rule"] == "Enum"},
}
# The sidecar balances k micro-batches only; dataset packing (ffd, bfd, sequential) runs
# in-process (packsched.planner.plan_local) or in `packsched plan`.
SIDECAR_ALGORITHMS = ("kk", "lpt")

# Integer options and the smallest value checked here: those whose 0 the proto reads as "the
# default" must be >= 1 on both paths; the others' ranges are the planner's to judge.
_MINIMUM = {
    f["name"]: None if f["rule"] in _NONE_RULES else 1
    for f in _PLAN_FIELDS
    if f["rule"] in _NONE_RULES + ("Count", "Align", "Ceiling")
}
# Options that are True or False.
_BOOLEANS = tuple(f["name"] for f in _PLAN_FIELDS if f["rule"] == "FixedK") + tuple(
    f["name"] for f in _ROUND_FIELDS
)


def split_options(cap, options, *, where, cap_required=False, sidecar=False):
    """Returns (plan options, loss options) with every default filled in and every value checked.

    ``cap``: the cap per micro-batch (the positional argument of every entry point); ``options``
    are the caller's keyword arguments; an unknown name raises TypeError naming it and
    ``where`` (the function), as Python does for a bad keyword. A bad value raises ValueError
    naming the option and the value: a name outside ``CHOICES`` (case matters), an integer option
    that is not an integer or is below its smallest valid value, no cap (None) where
    ``cap_required``. ``sidecar``: the call goes to the sidecar, which balances with kk or lpt only.
    Integer values come back as Python ints (numpy integers are accepted).
    """
    unknown = sorted(set(options) - set(PLAN_DEFAULTS) - set(LOSS_DEFAULTS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(unknown)}")
    plan = {name: options.get(name, default) for name, default in PLAN_DEFAULTS.items()}
    plan[CAP] = cap
    loss = {name: options.get(name, default) for name, default in LOSS_DEFAULTS.items()}
    if cap_required and cap is None:
        raise ValueError(
            f"{where}: {CAP} is required (the cap per micro-batch, in " "tokens), got None"
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
    if plan[WEIGHT_PAIR] is not None:
        cost = plan[WEIGHT_PAIR]
        if isinstance(cost, (str, bytes)) or not hasattr(cost, "__len__") or len(cost) != 2:
            raise ValueError(f"{WEIGHT_PAIR} = {cost!r}: must be a pair (a, b) of integers")
        plan[WEIGHT_PAIR] = tuple(_integer(WEIGHT_PAIR, x, 0, shown=cost) for x in cost)
    for name in _BOOLEANS:
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
