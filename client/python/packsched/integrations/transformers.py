"""packsched's attention in Hugging Face transformers: an unchanged HF decoder runs packed rows
(sequences one after another in one row, no padding) and tree-packed rows (each shared prefix
forwarded once) through transformers' attention-function registry.

    from packsched.integrations import transformers as packsched_hf
    packsched_hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="packsched_varlen")
    logits = model(input_ids=ids, position_ids=position_ids).logits    # ids: [1, total]

``register()`` adds two implementations to ``transformers.AttentionInterface`` and, for both, a
mask function to ``transformers.masking_utils.AttentionMaskInterface`` that builds no dense mask:

"packsched_varlen" (``packed_attention``): packsched.kernels.varlen_attention over the rows of
    the batch flattened to [batch * seq] tokens. The sequences are given by, in this order:
    ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (+ ``max_length_q`` / ``max_length_k``), the keyword
    arguments transformers' FlashAttention path takes for padding-free rows (int32 or int64
    tensors, or lists of ints such as a packsched plan's ``MicroBatchMeta.cu_seqlens``);
    else ``position_ids``, the model's own: a sequence starts at each row's first token and at
    every token whose position id is not its predecessor's + 1 (the rule of transformers'
    packed-sequence mask for eager and sdpa, so a row whose position ids restart at 0 per
    sequence runs each sequence on its own); else each row is one sequence. Offsets from a
    tensor take one device-to-host copy per forward (kept for the other layers while the
    tensor lives unchanged); host lists take none.
"packsched_tree" (``tree_packed_attention``): packsched.kernels.tree_attention over one
    tree-packed row; the layout comes as the keyword ``packsched_tree=TreeRows(...)`` given to
    the model's forward (transformers hands keyword arguments it does not know down to every
    attention call), and the model takes ``position_ids=rows.position_ids`` (the depths).

Both honour the layer's ``scaling`` (else ``module.scaling``, else head_dim ** -0.5),
``is_causal`` (else ``module.is_causal``), a causal ``sliding_window`` (the kwarg the layer
passes, None on full-attention layers: a key at most sliding_window - 1 positions back is seen,
on tree depths for the tree) and ``softcap`` (Gemma-style logit softcapping). Grouped-query
attention runs natively (key/value heads are not repeated). Both return (attn_output
[batch, seq, heads, head_dim], None) and support autograd. ValueError, naming the cause, for
what they cannot honour: a padding mask or a 4-D mask (pack the sequences instead), attention
dropout (``dropout`` != 0: set ``config.attention_dropout = 0`` or ``model.eval()``), attention
sinks (``s_aux``), ``output_attentions=True``, keys longer than the queries (a KV cache while
generating: switch to "sdpa" for generation), a bidirectional sliding window, layer types
other than full and sliding attention (chunked attention), and for the tree: no
``packsched_tree``, a batch of more than one row, rows that do not match the layout, non-causal
attention. Tested with transformers 5.10.

transformers is imported only when ``register()`` is called, so this module imports without it.
"""

import weakref

import numpy as np
import torch

from ..kernels import tree_attention, varlen_attention
from .tree_rows import TreeRows

__all__ = [
    "VARLEN",
    "TREE",
    "register",
    "packed_attention",
    "tree_packed_attention",
    "padding_free_mask",
    "TreeRows",
]

VARLEN = "packsched_varlen"
TREE = "packsched_tree"


def register():
    """Registers "packsched_varlen" and "packsched_tree" with transformers' AttentionInterface and
    AttentionMaskInterface (process-wide; calling it again changes nothing). Returns the names,
    for ``attn_implementation=`` (at load time or with ``model.set_attn_implementation``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, packed_attention)
    AttentionInterface.register(TREE, tree_packed_attention)
    AttentionMaskInterface.register(VARLEN, padding_free_mask)
    AttentionMaskInterface.register(TREE, padding_free_mask)
    return (VARLEN, TREE)


def padding_free_mask(batch_size, q_length, kv_length, attention_mask=None, **kwargs):
    """The mask function of both implementations: no dense [batch, 1, q, kv] mask is built (the
    kernels mask by their layout). Returns None, or the 2-D padding mask when ``attention_mask``
    marks padding, which the attention function then refuses."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:]
    return None if bool(mask.all()) else mask


class _HostCopies:
    """The host values derived from a tensor, computed once per tensor object (and in-place
    version) instead of once per layer: every layer of a forward gets the same position_ids or
    offsets tensors. Keeps the last few, by weak reference; the entries are replaced as a whole,
    so a reader never sees one tensor's key with another's value."""

    _SIZE = 4

    def __init__(self):
        self._entries = ()

    def get(self, tensor, extra, compute):
        key = (tensor._version, extra)
        for ref, entry_key, value in self._entries:
            if ref() is tensor and entry_key == key:
                return value
        value = compute()
        self._entries = ((weakref.ref(tensor), key, value),) + self._entries[: self._SIZE - 1]
        return value


_POSITION_SEGMENTS = _HostCopies()
_OFFSETS = _HostCopies()


def _segments_from_positions(position_ids, batch, seq):
    """Offsets [0, ..., batch * seq] of the sequences the position ids give (module docstring)."""
    pos = position_ids
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    if pos.dim() != 2 or pos.shape[-1] != seq or pos.shape[0] not in (1, batch):
        raise ValueError(
            f"{VARLEN}: position_ids of shape {list(position_ids.shape)} do not give the "
            f"sequences of a [{batch}, {seq}] batch (3-D rotary position ids: pass "
            "cu_seq_lens_q / cu_seq_lens_k instead)"
        )

    def compute():
        host = pos.detach().to("cpu", torch.int64).expand(batch, seq).numpy()
        starts = np.ones((batch, seq), dtype=bool)
        starts[:, 1:] = host[:, 1:] != host[:, :-1] + 1
        return np.flatnonzero(starts.reshape(-1)).tolist() + [batch * seq]

    return _POSITION_SEGMENTS.get(position_ids, (batch, seq), compute)


def _offsets(values, what):
    """Host offsets (list of ints) of cu_seq_lens given as a tensor or a list of ints."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{VARLEN}: {what} must be 1-D, got shape {list(values.shape)}")
        return _OFFSETS.get(values, what, lambda: [int(x) for x in values.tolist()])
    return [int(x) for x in values]


def _device_offsets(values, host, device):
    if isinstance(values, torch.Tensor) and values.dtype == torch.int32:
        return values.to(device)
    return torch.tensor(host, dtype=torch.int32, device=device)


def _max_length(given, host):
    if given is None:
        return max((b - a for a, b in zip(host, host[1:])), default=0)
    return int(given)


def _check_common(name, module, query, key, attention_mask, dropout, sliding_window, kwargs):
    """The ValueErrors both implementations share (module docstring)."""
    if attention_mask is not None:
        kind = "a 4-D attention mask" if attention_mask.dim() == 4 else "a padding mask"
        raise ValueError(
            f"{name}: {kind} was given; the packed layout is the mask. Pack the sequences "
            "without padding (one row, position_ids restarting at 0 per sequence) and pass no "
            "attention_mask"
        )
    if dropout:
        raise ValueError(
            f"{name}: attention dropout ({dropout}) is not implemented; set "
            "config.attention_dropout = 0 or call model.eval()"
        )
    if kwargs.get("s_aux") is not None:
        raise ValueError(f"{name}: attention sinks (s_aux) are not implemented")
    if kwargs.get("output_attentions"):
        raise ValueError(f"{name}: output_attentions=True needs the eager attention")
    layer_type = getattr(module, "layer_type", None)
    if layer_type not in (None, "full_attention", "sliding_attention"):
        raise ValueError(f"{name}: layer type {layer_type!r} is not implemented")
    if query.dim() != 4 or key.dim() != 4 or query.shape[0] != key.shape[0]:
        raise ValueError(
            f"{name}: query {list(query.shape)} and key {list(key.shape)} must be "
            "[batch, heads, seq, head_dim] with one batch"
        )
    if key.shape[2] != query.shape[2]:
        raise ValueError(
            f"{name}: {key.shape[2]} keys for {query.shape[2]} queries (a KV cache while "
            'generating); packed rows are for training and prefill: generate with "sdpa"'
        )
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"{name}: sliding_window = {sliding_window}: must be >= 1")


def _options(module, query, scaling, is_causal):
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    return scaling, bool(is_causal)


def _tokens(x):
    """[batch, heads, seq, dim] -> [batch * seq, heads, dim] (packsched's layout)."""
    return x.transpose(1, 2).reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3])


def packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    is_causal=None,
    **kwargs,
):
    """The "packsched_varlen" attention function (the module docstring has the contract):
    query [batch, heads, seq, head_dim], key and value [batch, kv_heads, seq, head_dim] ->
    (attn_output [batch, seq, heads, head_dim], None)."""
    _check_common(VARLEN, module, query, key, attention_mask, dropout, sliding_window, kwargs)
    if kwargs.get("packsched_tree") is not None:
        raise ValueError(
            f'{VARLEN}: packsched_tree was given: tree-packed rows need attn_implementation="'
            f'{TREE}"'
        )
    batch, heads, seq, dim = query.shape
    scaling, causal = _options(module, query, scaling, is_causal)
    if sliding_window is not None and not causal:
        raise ValueError(f"{VARLEN}: a bidirectional sliding window is not implemented")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if (cu_q is None) != (cu_k is None):
        raise ValueError(f"{VARLEN}: give both cu_seq_lens_q and cu_seq_lens_k, or neither")
    if cu_q is not None:
        host_q, host_k = _offsets(cu_q, "cu_seq_lens_q"), _offsets(cu_k, "cu_seq_lens_k")
        max_q = _max_length(kwargs.get("max_length_q"), host_q)
        max_k = _max_length(kwargs.get("max_length_k"), host_k)
    else:
        if kwargs.get("position_ids") is not None:
            host_q = _segments_from_positions(kwargs["position_ids"], batch, seq)
        else:
            host_q = [b * seq for b in range(batch + 1)]
        host_k, cu_k = host_q, None
        max_q = max_k = _max_length(None, host_q)
    for what, host in (("cu_seq_lens_q", host_q), ("cu_seq_lens_k", host_k)):
        if not host or host[0] != 0 or host[-1] != batch * seq:
            raise ValueError(
                f"{VARLEN}: {what} must run from 0 to the {batch * seq} tokens of the "
                f"[{batch}, {seq}] batch, got {host[:1]}..{host[-1:]}"
            )
    cu_q_device = _device_offsets(cu_q, host_q, query.device)
    cu_k_device = cu_q_device if cu_k is None else _device_offsets(cu_k, host_k, query.device)
    window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1,) * 2
    out = varlen_attention(
        _tokens(query),
        _tokens(key),
        _tokens(value),
        cu_q_device,
        cu_k_device,
        max_q,
        max_k,
        softmax_scale=scaling,
        causal=causal,
        window_size=window,
        softcap=0.0 if softcap is None else float(softcap),
        cu_seqlens_q_host=host_q,
        cu_seqlens_k_host=host_k,
    )
    return out.view(batch, seq, heads, dim), None


def tree_packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    is_causal=None,
    packsched_tree=None,
    **kwargs,
):
    """The "packsched_tree" attention function (the module docstring has the contract): one
    tree-packed row, query [1, heads, rows, head_dim], key and value [1, kv_heads, rows,
    head_dim], the layout in ``packsched_tree`` (a TreeRows) -> (attn_output [1, rows, heads,
    head_dim], None)."""
    _check_common(TREE, module, query, key, attention_mask, dropout, sliding_window, kwargs)
    if not isinstance(packsched_tree, TreeRows):
        raise ValueError(
            f"{TREE}: pass the micro-batch's layout to the model's forward as "
            f"packsched_tree=TreeRows(...), got {type(packsched_tree).__name__}"
        )
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        raise ValueError(f"{TREE}: the pieces come from packsched_tree, not cu_seq_lens_q/k")
    batch, heads, rows, dim = query.shape
    if batch != 1 or rows != packsched_tree.rows:
        raise ValueError(
            f"{TREE}: a batch of [{batch}, {rows}] tokens for a layout of [1, "
            f"{packsched_tree.rows}]: tree-packed rows are one row of the layout's rows"
        )
    scaling, causal = _options(module, query, scaling, is_causal)
    if not causal:
        raise ValueError(f"{TREE}: tree attention is causal; this layer is not")
    layout = packsched_tree.to(query.device)
    out = tree_attention(
        _tokens(query),
        _tokens(key),
        _tokens(value),
        layout.cu_seqlens,
        layout.max_seqlen,
        layout.subtree_end,
        layout.positions,
        softmax_scale=scaling,
        window_left=-1 if sliding_window is None else int(sliding_window) - 1,
        softcap=0.0 if softcap is None else float(softcap),
        cu_seqlens_host=layout.cu_seqlens_host,
        total=layout.total,
    )
    return out.view(1, rows, heads, dim), None
