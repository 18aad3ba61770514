"""The definitions of the hybrid layers' recurrent kernels, one sequence at a time in plain torch
(float64 in the tests): what packsched.kernels.causal_conv1d, gated_delta_rule and
selective_scan must equal on every sequence of a packed row and every rollout of a tree."""

import torch


def conv_ref(x, weight, bias=None, silu=True):
    """x [L, C], weight [C, W]: out[t] = act(bias + sum_j weight[:, j] x[t - (W - 1) + j]), zeros
    before the sequence's first token (transformers' causal_conv1d_fn with no initial state)."""
    length, _ = x.shape
    width = weight.shape[1]
    padded = torch.cat([x.new_zeros(width - 1, x.shape[1]), x])
    out = torch.stack([(padded[t : t + width].T * weight).sum(-1) for t in range(length)])
    if bias is not None:
        out = out + bias
    return torch.nn.functional.silu(out) if silu else out


def gated_delta_ref(q, k, v, g, beta=None):
    """q, k [L, H, K], v [L, H, V], g and beta [L, H]; per head and token:
    S = exp(g_t) S;  S = S + k_t (beta_t (v_t - Sᵀ k_t))ᵀ (S = S + k_t v_tᵀ without beta);
    o_t = Sᵀ q_t — transformers' torch_recurrent_gated_delta_rule on already normalised q, k."""
    length, heads, kd = k.shape
    state = q.new_zeros(heads, kd, v.shape[-1])
    outs = []
    for t in range(length):
        state = state * g[t].exp()[:, None, None]
        if beta is None:
            delta = v[t]
        else:
            delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", state, k[t]))
        state = state + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(outs)


def selective_scan_ref(x, dt, A, B, C, D=None):
    """x [L, H, P], dt [L, H], A [H], B and C [L, G, N], D [H]: per head h (group h // (H / G))
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_tᵀ (an N x P state), y_t = C_tᵀ h_t + D x_t."""
    length, heads, hd = x.shape
    rep = heads // B.shape[1]
    state = x.new_zeros(heads, B.shape[-1], hd)
    outs = []
    for t in range(length):
        Bt = B[t].repeat_interleave(rep, 0)
        Ct = C[t].repeat_interleave(rep, 0)
        decay = torch.exp(dt[t] * A)
        state = decay[:, None, None] * state + dt[t][:, None, None] * Bt[:, :, None] * x[t][:, None]
        y = torch.einsum("hnp,hn->hp", state, Ct)
        if D is not None:
            y = y + D[:, None] * x[t]
        outs.append(y)
    return torch.stack(outs)


def rollout_paths(node_begin, node_end, node_parent, leaves):
    """The packed rows of each leaf's root path, root first (the tree's rollouts)."""
    paths = []
    for leaf in leaves:
        chain = []
        n = leaf
        while n >= 0:
            chain.append(torch.arange(node_begin[n], node_end[n]))
            n = node_parent[n]
        paths.append(torch.cat(chain[::-1]))
    return paths
