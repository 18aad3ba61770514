"""The partition and metric helpers of verl's ``seqlen_balancing`` module, on packsched's planner
(re-exported by ``packsched.compat.verl``). Values to balance are any non-negative integers
(sequence lengths or ``calculate_workload`` workloads)."""

from .. import planner

# verl's workload model, 24576·L + L² (a 7B dense decoder), which is also the planner's default
# attention cost (docs/design.md §2).
WORKLOAD_LINEAR = 24576
WORKLOAD_QUADRATIC = 1

# The largest total the planner takes for a plan without a cap (an int32 offset).
_PLANNER_MAX = (1 << 31) - 1


def calculate_workload(seqlen_list):
    """verl's estimate of a sequence's compute, 24576·L + L², element-wise. A torch tensor gives
    a tensor (integer ones upcast to int64 first, so long sequences cannot overflow), a numpy
    array an array, an int an int, any other sequence a list of ints."""
    module = type(seqlen_list).__module__
    if module.startswith("torch"):
        values = seqlen_list if seqlen_list.is_floating_point() else seqlen_list.long()
    elif module == "numpy":
        values = seqlen_list if seqlen_list.dtype.kind == "f" else seqlen_list.astype("int64")
    elif isinstance(seqlen_list, int):
        values = seqlen_list
    else:
        return [calculate_workload(int(x)) for x in seqlen_list]
    return WORKLOAD_LINEAR * values + WORKLOAD_QUADRATIC * values * values


def ceildiv(a, b):
    """The smallest integer >= a / b (b != 0)."""
    return -(a // -b)


def roundup_divisible(a, b):
    """The smallest multiple of b (b > 0) that is >= a."""
    return ceildiv(a, b) * b


def _planner_values(values):
    """``values`` as the planner's lengths: each divided by ceil(total / (2^31 - 1 - n)), rounded
    up and at least 1, so that their total fits the planner's int32 offsets whatever the
    workloads; the sums' balance is kept to that granularity."""
    if type(values).__module__.startswith("torch"):
        values = values.tolist()
    values = [int(v) for v in values]
    if any(v < 0 for v in values):
        raise ValueError("seqlen_list: values must be >= 0")
    scale = max(1, ceildiv(sum(values), _PLANNER_MAX - len(values)))
    return [max(1, ceildiv(v, scale)) for v in values]


def _partition(seqlen_list, k_partitions, equal_size, algorithm):
    """k lists of indices into ``seqlen_list`` with balanced sums (the planner's ``algorithm``,
    token cost, no cap); with ``equal_size`` each holds n / k of them. Parts may be empty when
    k > n. Raises ValueError for k < 1, or equal_size with n not a multiple of k."""
    values = _planner_values(seqlen_list)
    if k_partitions < 1:
        raise ValueError(f"k_partitions = {k_partitions}: must be >= 1")
    if equal_size and len(values) % k_partitions:
        raise ValueError(
            f"equal_size: {len(values)} items do not split into {k_partitions} equal parts"
        )
    plan = planner.partition(
        values, k_partitions, None, cost="tokens", algorithm=algorithm, equal_size=equal_size
    )
    return [list(part) for part in plan.micro_batches]


def karmarkar_karp(seqlen_list, k_partitions, equal_size):
    """verl's ``karmarkar_karp``: ``k_partitions`` lists of indices with balanced sums of
    ``seqlen_list`` (packsched's Karmarkar–Karp, largest differencing), each index in exactly one;
    with ``equal_size`` each list holds len / k indices (ValueError when k does not divide it,
    where verl asserts). Lists may be empty when k exceeds the item count, as verl's."""
    return _partition(seqlen_list, k_partitions, equal_size, "kk")


def greedy_partition(seqlen_list, k_partitions, equal_size):
    """verl's ``greedy_partition``: the same contract as ``karmarkar_karp``, by greedy assignment
    to the lightest list. verl assigns in input order; packsched's LPT takes the items largest
    first (the same greedy, sorted, so never a worse bound: makespan <= 4/3 of optimal)."""
    return _partition(seqlen_list, k_partitions, equal_size, "lpt")


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """verl's ``get_seqlen_balanced_partitions``: exactly ``k_partitions`` non-empty lists of
    indices, each sorted, covering every index once, with balanced sums (Karmarkar–Karp); with
    ``equal_size`` each holds len / k. ``seqlen_list`` may hold workloads of any size (see
    ``_planner_values``). Raises ValueError when k exceeds the item count (verl asserts)."""
    if k_partitions > len(seqlen_list):
        raise ValueError(
            f"k_partitions = {k_partitions} exceeds the {len(seqlen_list)} items: "
            "a partition would be empty"
        )
    return [sorted(part) for part in karmarkar_karp(seqlen_list, k_partitions, equal_size)]


def log_seqlen_unbalance(seqlen_list, partitions, prefix):
    """verl's balance metrics, keys ``{prefix}/...``: ``min``, ``max`` and ``minmax_diff`` of the
    sums of consecutive chunks of len // k items in input order (the split without balancing),
    ``balanced_min`` and ``balanced_max`` of the partitions' sums, and ``mean`` = total / k.
    Raises ValueError when there are fewer items than partitions (no chunk to measure)."""
    values = [int(v) for v in seqlen_list]
    chunk = len(values) // len(partitions)
    if chunk == 0:
        raise ValueError(f"{len(values)} items for {len(partitions)} partitions")
    chunk_sums = [sum(values[start : start + chunk]) for start in range(0, len(values), chunk)]
    balanced = [sum(values[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": min(chunk_sums),
        f"{prefix}/max": max(chunk_sums),
        f"{prefix}/minmax_diff": max(chunk_sums) - min(chunk_sums),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(values) / len(partitions),
    }


def get_group_balanced_partitions(seqlen_list, uid_list, k_partitions):
    """verl's ``get_group_balanced_partitions``: ``k_partitions`` sorted lists of sample indices
    where the samples of one group (a run of consecutive equal ``uid_list`` entries, as verl
    reads them) stay together, balancing the groups' summed ``calculate_workload``. Each list gets
    the same number of groups when k divides the group count (verl requires that; here other
    counts are balanced without it). Raises ValueError when the lists differ in length or there
    are fewer groups than partitions."""
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"{len(seqlen_list)} seqlens for {len(uid_list)} uids")
    groups = []  # sample indices per run of equal uids
    for i, uid in enumerate(uid_list):
        if groups and uid_list[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < k_partitions:
        raise ValueError(
            f"{len(groups)} uid groups for k_partitions = {k_partitions}: need at least as many "
            "groups as partitions"
        )
    workloads = [sum(calculate_workload(int(seqlen_list[i])) for i in g) for g in groups]
    equal = len(groups) % k_partitions == 0
    parts = get_seqlen_balanced_partitions(workloads, k_partitions, equal_size=equal)
    return [sorted(i for g in part for i in groups[g]) for part in parts]
