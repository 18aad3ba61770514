"""Drop-in replacements for the dynamic-batching helpers of existing trainers.

``packsched.compat.verl`` and ``packsched.compat.openrlhf`` keep the upstream signatures and
return conventions, so switching is a change of import; the plans come from the packsched
planner, so every micro-batch honours the token cap wherever the upstream call carries one (each
module says how) and the balance is better.
"""
