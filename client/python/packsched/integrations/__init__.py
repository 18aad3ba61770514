"""Integrations of packsched into other libraries' extension points.

``packsched.integrations.transformers``: packsched's varlen attention and tree attention as
attention implementations of Hugging Face transformers ("packsched_varlen", "packsched_tree"),
so an unchanged HF decoder runs packed rows and tree-packed rows. ``packsched.integrations.
tree_rows``: ``TreeRows``, the layout of one tree-packed micro-batch that the tree attention
takes. ``packsched.integrations.trl``: ``pack_dataset``, TRL's dataset packing (best fit
decreasing) or packsched's balanced packing, in TRL's packed format (``seq_lengths``), for
``SFTTrainer`` with ``padding_free=True``. Nothing here is imported by ``import packsched``, and
each module imports its library (transformers, TRL, torch) only when it is used.
"""
