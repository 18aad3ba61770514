"""Drop-in replacements for the dynamic-batching helpers of existing trainers.

``packsched.compat.slime`` adds a slime-style entry point: the whole global batch to per-rank
micro-batches in one call, on the coordinator mode's ``sync="micro_batch"`` schedule.

``packsched.compat.verl`` and ``packsched.compat.openrlhf`` keep the upstream signatures and
return conventions, so switching is a change of import; the plans come from the packsched
planner, so every micro-batch honours the token cap wherever the upstream call carries one (each
module says how) and the balance is better.
"""
