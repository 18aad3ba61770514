"""Kernels for padding-free training: unpad/pad, aligned (THD) packing, position ids, label
shifting, packed cross entropy, and varlen attention (forward, backward, torch autograd and
torch.compile).

Inputs are any DLPack producer (torch tensors, numpy arrays, cupy arrays, ...). Outputs are
allocated by the input's own library on the input's device (torch tensors for torch inputs,
on torch's current CUDA stream; numpy arrays for numpy inputs); other host producers get numpy
outputs (torch ones for a dtype numpy lacks, such as bfloat16, when torch is installed). Inputs
that are not contiguous are made contiguous first (a copy). The CPU runs the floating kernels
in float16, bfloat16, float32 and float64 (CUDA attention: no float64); a dtype a kernel does not
take raises ValueError naming the argument and the dtype.

Torch tensors go through ``torch.library`` custom ops, ``torch.ops.packsched.<name>``:
varlen_attention_forward / _backward, tree_attention_forward / _backward, packed_cross_entropy /
_backward, multi_target_cross_entropy / _backward (differentiable through the _backward op), and
unpad, pad, pack_aligned, unpack_aligned, position_ids, shift_labels, tree_position_ids (no
gradient). torch.compile traces them: a model calling these functions compiles with
``fullgraph=True``, and AOTAutograd differentiates it. Each op has a fake implementation that
gives the outputs' shapes and dtypes from the inputs' shapes and the host offsets, so outputs
whose length is an offset (unpad, unpack_aligned, pack_aligned, position_ids and
tree_position_ids without ``total``) need ``cu_seqlens_host``: without it the function reads the
offsets tensor first (a graph break under torch.compile). Host offsets trace as ints, symbolic
under dynamic shapes (one graph per batch size B). Numpy inputs call the kernels directly.

Hybrid models' recurrent layers (causal_conv1d, gated_delta_rule, selective_scan; torch tensors,
autograd) take the layout as ``prev_row``, the row whose state each row continues (-1: zero
state): ``flat_prev_rows`` from cu_seqlens, ``tree_prev_rows`` / ``micro_batch_prev_rows`` for
trees, where a node's first row continues its parent's last row.

Packed layout: B sequences stored as rows [0, total) of one tensor, sequence b in rows
[cu_seqlens[b], cu_seqlens[b+1]). ``cu_seqlens`` is int32 [B+1], cu_seqlens[0] == 0,
non-decreasing (empty sequences allowed). Aligned layout: sequence b occupies rows
[cu_seqlens_padded[b], cu_seqlens_padded[b+1]), its real tokens first, pad slots after.

Tail: a plan made with ``align_total_to > 1`` (Ulysses sequence parallelism) gives each
micro-batch ``total`` rows, more than its offsets cover. Pass ``total=`` (the plan's
``MicroBatch.total``) to declare rows [offsets[-1], total) as the tail: pack_aligned fills it with
``pad_value``, position_ids restart at 0 there (verl's Ulysses padding), shift_labels gives
``ignore_index``, packed_cross_entropy gives loss 0 (and zero gradient), attention never uses its
rows as keys and gives them out 0 / lse +inf (and zero gradients), unpack_aligned drops it.
Without ``total=`` the rows must match the offsets exactly.

Every function accepts ``cu_seqlens_host`` (a list of ints, e.g. from the packsched plan): with
it, no call needs a device-to-host copy. Without it a CUDA ``cu_seqlens`` is copied to the host
(a sync). Invalid arguments raise ValueError with a message naming the argument.

The implementation lives in one private module per job, re-exported here: _arrays (array
adapters and argument checks), _packing (unpad/pad, aligned layouts, positions, labels),
_cross_entropy (packed cross entropy and its gradient), _attention (varlen attention),
_context_parallel (context parallelism and 3-D positions), tree_kernels (tree packing: the tree
mask, depths, multi-target cross entropy). None imports this module. The torch path is
_torch_ops (imported here when torch already is, else with the first torch tensor): the ops of
_ops_attention, _ops_loss and _ops_packing over the jobs' own functions, and _torch_args.
"""

import sys as _sys

from ._attention import varlen_attention, varlen_attention_backward, varlen_attention_forward
from ._context_parallel import (
    cp_attention,
    cp_cross_entropy,
    cp_layout,
    cp_position_ids,
    cp_shard,
    cp_shift_labels,
    cp_unshard,
    mrope_position_ids,
)
from ._cross_entropy import packed_cross_entropy
from ._packing import (
    aligned_cu_seqlens,
    built_with_cuda,
    pack_aligned,
    pad,
    position_ids,
    shift_labels,
    unpack_aligned,
    unpad,
)
from ._recurrent import (
    causal_conv1d,
    flat_prev_rows,
    gated_delta_rule,
    micro_batch_prev_rows,
    selective_scan,
    states_alive,
    tree_prev_rows,
)
from .tree_kernels import multi_target_cross_entropy, tree_attention, tree_position_ids

if "torch" in _sys.modules:  # register torch.ops.packsched now (else with the first torch tensor)
    from . import _torch_ops  # noqa: F401

__all__ = [
    "unpad",
    "pad",
    "pack_aligned",
    "unpack_aligned",
    "aligned_cu_seqlens",
    "position_ids",
    "shift_labels",
    "packed_cross_entropy",
    "built_with_cuda",
    "varlen_attention",
    "varlen_attention_forward",
    "varlen_attention_backward",
    "cp_layout",
    "cp_shard",
    "cp_unshard",
    "cp_position_ids",
    "cp_shift_labels",
    "cp_attention",
    "cp_cross_entropy",
    "mrope_position_ids",
    "tree_attention",
    "tree_position_ids",
    "multi_target_cross_entropy",
    "causal_conv1d",
    "gated_delta_rule",
    "selective_scan",
    "flat_prev_rows",
    "tree_prev_rows",
    "micro_batch_prev_rows",
    "states_alive",
]
