"""packsched.kernels.packed_cross_entropy is differentiable for torch logits that require grad."""

import torch

from packsched import kernels


def packed_case(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 0, 5, 1, 4]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    rows, vocab = int(cu[-1]), 7
    logits = torch.randn(rows, vocab, generator=g, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, vocab, (rows,), generator=g)
    labels = kernels.shift_labels(ids, cu)
    labels[2] = -100  # one more ignored token inside a sequence
    return logits, labels, cu


def test_gradcheck_float64():
    logits, labels, cu = packed_case(0, torch.float64)

    def f(x):
        loss, sums, _ = kernels.packed_cross_entropy(x, labels, cu)
        return loss * torch.arange(1, len(loss) + 1, dtype=x.dtype), sums

    assert torch.autograd.gradcheck(f, (logits,), eps=1e-6, atol=1e-9)


def test_values_and_gradients_match_torch():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        logits, labels, cu = packed_case(1, dtype)
        weights = torch.linspace(0.5, 2.0, len(cu) - 1, dtype=dtype)
        _, sums, counts = kernels.packed_cross_entropy(logits, labels, cu)
        (sums * weights).sum().backward()
        ours = logits.grad.clone()

        reference = logits.detach().clone().requires_grad_(True)
        per_token = torch.nn.functional.cross_entropy(reference, labels.long(), ignore_index=-100,
                                                      reduction="none")
        seq = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
        ref_sums = torch.zeros(len(cu) - 1, dtype=dtype).index_add(0, seq, per_token)
        (ref_sums * weights).sum().backward()
        assert torch.allclose(sums, ref_sums.detach(), atol=tol, rtol=tol)
        assert counts.tolist() == [int(((labels != -100) & (seq == b)).sum()) for b in range(len(cu) - 1)]
        assert torch.allclose(ours, reference.grad, atol=tol, rtol=tol)


def test_no_grad_inputs_give_plain_tensors():
    logits, labels, cu = packed_case(2, torch.float32)
    loss, _, _ = kernels.packed_cross_entropy(logits.detach(), labels, cu)
    assert loss.grad_fn is None
