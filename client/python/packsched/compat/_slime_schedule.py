"""``build_dp_schedule`` with slime's signature and result (slime.utils.dp_schedule), planned by
packsched. Re-exported by packsched.compat.slime.

slime's rules, kept:

- Steps: samples are grouped by rollout id (``rollout_indices``, in order of first appearance);
  a step takes ``global_batch_size`` whole rollouts, and trailing rollouts that do not fill a
  step are left out. With ``args.global_batch_tokens`` a step instead takes a run of whole
  rollouts whose sample count is a positive multiple of ``dp_size``: the first such run that
  reaches the budget, or the longest one below it when that is strictly nearer the budget;
  rollouts that cannot form such a run are left out.
- Counts: every rank runs the same number of micro-batches in a step, a multiple of
  ``microbatch_group_size_per_vp_stage`` when ``vpp_size > 1``; no micro-batch is empty.
- Static batch size (``args.use_dynamic_batch_size`` false): chunks of ``args.micro_batch_size``
  samples in order; their count must be a multiple of ``dp_size`` (x the VPP group), else
  ValueError, since splitting a chunk would break the fixed size.
- Dynamic batch size: the cap is ``max(1, int(max_tokens_per_gpu * cp_size *
  packing_safety_margin))`` tokens per micro-batch; a sample longer than the cap runs alone.
- Ranks: with ``args.balance_data`` the micro-batches go to ranks by Karmarkar-Karp on their
  estimated work, K / dp_size each; otherwise rank r takes micro-batches r, r + dp_size, ...

What packsched changes (dynamic batch size only): the count is the smallest packsched finds that
keeps the cap (never more than slime's first fit), rounded up to the alignment, and the samples
are balanced over those micro-batches (Karmarkar-Karp) instead of filling them first come, first
served. Work per sample for ``balance_data`` is packsched.compat.verl's ``calculate_workload``
(slime's is the model's FLOPs; both grow as L + L^2 / const). Multimodal-aware packing
(``args.multimodal_aware_packing``) is not offered.
"""

from .. import planner
from ._balancing import calculate_workload, get_seqlen_balanced_partitions

__all__ = ["build_dp_schedule", "PackschedSlimeError"]


class PackschedSlimeError(ValueError, AssertionError):
    """A schedule slime refuses with an ``assert`` (or ``raise AssertionError``): raised at exactly
    those places, so that a caller of slime's ``build_dp_schedule`` that catches AssertionError
    catches it, and one that catches ValueError (packsched's convention for bad input) too. Where
    slime raises ValueError (a non-positive ``global_batch_tokens``) or does not check (rollout
    ids and lengths that differ in number), plain ValueError."""


def build_dp_schedule(
    args,
    train_parallel_config,
    total_lengths,
    *,
    global_batch_size,
    rollout_indices,
    sample_is_multimodal=None,
):
    """slime's ``build_dp_schedule``: the per-rank samples and micro-batches of every step.

    args: an object with ``use_dynamic_batch_size``, ``max_tokens_per_gpu`` (dynamic),
        ``micro_batch_size`` (static), ``balance_data``, and optionally
        ``packing_safety_margin`` (1.0) and ``global_batch_tokens`` (None).
    train_parallel_config: ``{"dp_size", "cp_size", "vpp_size",
        "microbatch_group_size_per_vp_stage"}``.
    total_lengths: tokens per sample; rollout_indices: the rollout id of each sample.

    Returns ``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)`` as slime
    does: ``partitions[r]`` the global sample indices of rank r over all steps,
    ``micro_batch_indices[r]`` its micro-batches as positions in ``partitions[r]`` (they tile
    ``range(len(partitions[r]))`` in order), ``num_microbatches[s]`` the per-rank count of step
    s, ``global_batch_sizes[s]`` its rollout count.

    Raises PackschedSlimeError (a ValueError and an AssertionError) where slime asserts: dynamic
    batch size without ``max_tokens_per_gpu``, static without ``micro_batch_size``, a
    ``sample_is_multimodal`` of another length than ``total_lengths``, no complete step (fewer
    rollouts than ``global_batch_size``, or none forming a ``global_batch_tokens`` step), a step
    with fewer samples than ranks, a dynamic step too small to fill the aligned count without an
    empty micro-batch, a static count that is not aligned. ValueError where slime raises it (a
    non-positive ``global_batch_tokens``) and for rollout ids and lengths of different numbers;
    NotImplementedError for multimodal-aware packing.
    """
    dp_size = int(train_parallel_config["dp_size"])
    cp_size = int(train_parallel_config["cp_size"])
    vpp_size = int(train_parallel_config["vpp_size"])
    mb_group = int(train_parallel_config["microbatch_group_size_per_vp_stage"])
    lengths = [int(v) for v in total_lengths]
    if len(rollout_indices) != len(lengths):
        raise ValueError(f"{len(rollout_indices)} rollout indices for {len(lengths)} samples")
    if sample_is_multimodal is not None and len(sample_is_multimodal) != len(lengths):
        raise PackschedSlimeError(
            f"sample_is_multimodal has {len(sample_is_multimodal)} entries for "
            f"{len(lengths)} samples (total_lengths)"
        )
    if sample_is_multimodal is not None and getattr(args, "multimodal_aware_packing", "off") in (
        "separate",
        "separate_raw",
    ):
        raise NotImplementedError("packsched does not offer slime's multimodal-aware packing")
    align = dp_size * (mb_group if vpp_size > 1 else 1)
    dynamic = bool(args.use_dynamic_batch_size)
    cap = None
    if dynamic:
        if args.max_tokens_per_gpu is None:
            raise PackschedSlimeError("use_dynamic_batch_size needs max_tokens_per_gpu")
        margin = getattr(args, "packing_safety_margin", 1.0)
        cap = max(1, int(args.max_tokens_per_gpu * cp_size * margin))

    rollouts = _samples_by_rollout(rollout_indices)
    budget = getattr(args, "global_batch_tokens", None)
    if budget is not None:
        steps = _token_budget_steps(rollouts, lengths, int(budget), dp_size)
    else:
        steps = _fixed_steps(rollouts, int(global_batch_size))

    partitions = [[] for _ in range(dp_size)]
    micro_batch_indices = [[] for _ in range(dp_size)]
    num_microbatches, global_batch_sizes = [], []
    for step, samples in enumerate(steps):
        global_batch_sizes.append(len(samples))
        indices = [i for rollout in samples for i in rollout]
        step_lengths = [lengths[i] for i in indices]
        if len(indices) < dp_size:
            raise PackschedSlimeError(
                f"step {step}: {len(indices)} samples for dp_size {dp_size}: every rank needs "
                "at least one"
            )
        if dynamic:
            mbs = _dynamic_micro_batches(step_lengths, cap, align, step)
        else:
            mbs = _static_micro_batches(len(indices), _micro_batch_size(args), align, step)
        num_microbatches.append(len(mbs) // dp_size)
        if args.balance_data:
            work = [sum(calculate_workload(step_lengths[i]) for i in mb) for mb in mbs]
            ranks = get_seqlen_balanced_partitions(work, dp_size, equal_size=True)
        else:
            ranks = [list(range(r, len(mbs), dp_size)) for r in range(dp_size)]
        for r, owned in enumerate(ranks):
            for m in owned:
                start = len(partitions[r])
                partitions[r].extend(indices[i] for i in mbs[m])
                micro_batch_indices[r].append(list(range(start, start + len(mbs[m]))))
    return partitions, micro_batch_indices, num_microbatches, global_batch_sizes


def _samples_by_rollout(rollout_indices):
    """The sample positions of each rollout id, in order of the ids' first appearance."""
    by_id = {}
    for position, rollout in enumerate(rollout_indices):
        by_id.setdefault(rollout, []).append(position)
    return list(by_id.values())


def _micro_batch_size(args):
    size = getattr(args, "micro_batch_size", None)
    if size is None:
        raise PackschedSlimeError(
            "a static batch size (use_dynamic_batch_size off) needs " "micro_batch_size"
        )
    return int(size)


def _fixed_steps(rollouts, global_batch_size):
    if global_batch_size < 1 or len(rollouts) < global_batch_size:
        raise PackschedSlimeError(
            f"num_rollouts ({len(rollouts)}) < global_batch_size ({global_batch_size}): no "
            "complete step"
        )
    count = len(rollouts) // global_batch_size
    return [rollouts[s * global_batch_size : (s + 1) * global_batch_size] for s in range(count)]


def _token_budget_steps(rollouts, lengths, budget, dp_size):
    """Runs of whole rollouts, each the one whose sample count is a positive multiple of
    ``dp_size`` and whose tokens come nearest ``budget``: the first such run that reaches the
    budget, or the last one below it when that is strictly nearer."""
    if budget <= 0:
        raise ValueError(f"global_batch_tokens must be positive, got {budget}")
    steps, start = [], 0
    while start < len(rollouts):
        below, chosen = None, None
        samples = tokens = 0
        for end in range(start + 1, len(rollouts) + 1):
            samples += len(rollouts[end - 1])
            tokens += sum(lengths[i] for i in rollouts[end - 1])
            if samples < dp_size or samples % dp_size:
                continue
            if tokens >= budget:
                nearer_below = below is not None and budget - below[1] < tokens - budget
                chosen = below[0] if nearer_below else end
                break
            below = (end, tokens)
        if chosen is None:
            if below is None or below[0] != len(rollouts):
                break  # the rest cannot form an aligned step
            chosen = below[0]
        steps.append(rollouts[start:chosen])
        start = chosen
    if not steps:
        raise PackschedSlimeError(
            f"num_rollouts ({len(rollouts)}) cannot form a step of global_batch_tokens {budget} "
            f"with dp_size {dp_size}"
        )
    return steps


def _static_micro_batches(n, micro_batch_size, align, step):
    mbs = [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    if len(mbs) % align:
        raise PackschedSlimeError(
            f"step {step}: {n} samples in micro-batches of {micro_batch_size} make {len(mbs)}, "
            f"not a multiple of dp_size x the VPP group ({align}); a static micro-batch cannot "
            "be split: make the step's samples a multiple of "
            f"{align * micro_batch_size}"
        )
    return mbs


def _dynamic_micro_batches(lengths, cap, align, step):
    """K non-empty micro-batches (indices into ``lengths``, ascending in each): K is packsched's
    smallest count under ``cap`` rounded up to a multiple of ``align``; a sample over the cap
    runs alone."""
    options = dict(overlong="isolate", cost="tokens")
    bound = planner.local_bound(lengths, cap, progress=False, **options).k
    k = max(align, -(-bound // align) * align)
    if k > len(lengths):
        raise PackschedSlimeError(
            f"step {step}: {len(lengths)} samples cannot fill {k} micro-batches (a multiple of "
            f"dp_size x the VPP group, {align}) without an empty one"
        )
    parts = [
        sorted(mb)
        for mb in planner.partition(lengths, k, cap, progress=False, **options).micro_batches
    ]
    for empty in [i for i, mb in enumerate(parts) if not mb]:
        # Never empty (slime forbids it): take the shortest sample of the fullest micro-batch.
        donor = max(range(len(parts)), key=lambda i: len(parts[i]))
        moved = min(parts[donor], key=lambda i: lengths[i])
        parts[donor].remove(moved)
        parts[empty] = [moved]
    return parts
