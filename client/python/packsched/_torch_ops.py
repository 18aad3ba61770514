"""The torch path of packsched.kernels: every kernel a model calls is a ``torch.library`` custom op
in the ``packsched`` namespace, so torch.compile traces it (no graph break on the call) and
AOTAutograd differentiates it. Imported with the first torch tensor a kernel sees (it imports
torch; numpy users never load it).

Ops (``torch.ops.packsched.<name>``; schemas in the modules that define them):

- _ops_attention: varlen_attention_forward / _backward, tree_attention_forward / _backward;
- _ops_loss: packed_cross_entropy / _backward, multi_target_cross_entropy / _backward;
- _ops_packing: unpad, pad, pack_aligned, unpack_aligned, position_ids, shift_labels,
  tree_position_ids (no gradients, as before).

Contract of every op: the implementation is the direct path's own function with lib = torch, so
results are those of the numpy path bit for bit; the fake implementation derives output shapes,
dtypes and devices from the inputs' and raises the same ValueError for a dtype the kernels do not
take; the differentiable forward ops register a setup_context and a backward that calls the matching
_backward op (eager calls that need a gradient run the same two functions in an autograd.Function:
_torch_args.differentiable says why). Layout arguments take schema forms: host offsets ``SymInt[]``
(a list of ints; symbolic under dynamic shapes, so one compiled graph serves every layout with the
same batch size B), ints ``SymInt``, scales ``float``, flags ``bool``, optional tensors ``Tensor?``.

Data-dependent sizes: the ops whose output length is an offset (unpad, unpack_aligned,
pack_aligned, position_ids and tree_position_ids without ``total``) take the host offsets, and the
public function reads them from the tensor when the caller gave none (a device-to-host copy; a
graph break under torch.compile, before the op). Unbacked sizes (``ctx.new_dynamic_size()``)
would spare that break but flow into every later shape of the model (q, the logits), where each
broadcast against a backed size needs a torch._check; the plan has the host offsets anyway.
"""

from ._ops_attention import tree_attention, varlen_attention, varlen_attention_backward
from ._ops_loss import multi_target_cross_entropy, packed_cross_entropy
from ._ops_packing import (
    pack_aligned,
    pad,
    position_ids,
    shift_labels,
    tree_position_ids,
    unpack_aligned,
    unpad,
)

__all__ = [
    "varlen_attention",
    "varlen_attention_backward",
    "tree_attention",
    "packed_cross_entropy",
    "multi_target_cross_entropy",
    "unpad",
    "pad",
    "pack_aligned",
    "unpack_aligned",
    "position_ids",
    "tree_position_ids",
    "shift_labels",
]
