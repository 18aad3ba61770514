"""Integrations of packsched into other libraries' extension points.

``packsched.integrations.trl``: ``pack_dataset``, TRL's dataset packing (best fit decreasing) or
packsched's balanced packing, in TRL's packed format (``seq_lengths``), for ``SFTTrainer`` with
``padding_free=True``. Nothing here is imported by ``import packsched``; each module imports its
library only when it is used.
"""
