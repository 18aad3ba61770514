"""Integrations of packsched's kernels into other libraries' extension points.

``packsched.integrations.transformers``: packsched's varlen attention and tree attention as
attention implementations of Hugging Face transformers ("packsched_varlen", "packsched_tree"),
so an unchanged HF decoder runs packed rows and tree-packed rows. ``packsched.integrations.
tree_rows``: ``TreeRows``, the layout of one tree-packed micro-batch that the tree attention
takes. Nothing here is imported by ``import packsched``, and each module imports its library
(transformers, torch) only when it is used.
"""
