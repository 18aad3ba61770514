"""``TreeRows``: the layout of one tree-packed micro-batch as tree attention takes it, made once
per micro-batch and handed to every attention layer (docs/design.md, "Tree packing": the mask
rule, and the layout a ``TreePlan`` gives)."""

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels import tree_position_ids

__all__ = ["TreeRows"]


def _host_ints(values, what):
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"TreeRows: {what} must be a 1-D sequence of integers")
    return array.astype(np.int64)


@dataclass(frozen=True, eq=False)
class TreeRows:
    """One tree-packed micro-batch of ``rows`` packed rows (pieces one after another, each a tree
    or part of one with its nodes in depth-first preorder):

        cu_seqlens       int32 tensor [P + 1], the piece offsets (a piece's alignment padding
                         lies inside its range)
        cu_seqlens_host  the same offsets, a list of ints (so no call copies them to the host)
        max_seqlen       the longest piece, an int
        subtree_end      int32 tensor [rows]: one past the last row of each row's subtree
        positions        int32 tensor [rows]: each row's depth, its position in every rollout
                         through it
        total            the rows when they go past the last offset (a tail: its rows are never
                         keys, and their output is 0), else None

    Query row i sees key row j of its piece iff j <= i < subtree_end[j] (and, with a sliding
    window w, positions[i] - positions[j] < w): each rollout attends as if run on its own. The
    value ranges are checked by the kernel (ValueError naming the row).

    Make it with ``from_micro_batch`` (a micro-batch of a packsched ``TreePlan``) or
    ``from_arrays`` (any layout that follows the rule). The model takes ``position_ids`` (the
    depths, int64 [1, rows]) so that its rotary embedding sees each token at its rollout
    position.
    """

    cu_seqlens: torch.Tensor
    cu_seqlens_host: list
    max_seqlen: int
    subtree_end: torch.Tensor
    positions: torch.Tensor
    total: int = None

    @property
    def rows(self):
        """The packed rows the layout covers: ``total``, or the last offset without a tail."""
        return self.cu_seqlens_host[-1] if self.total is None else self.total

    @property
    def position_ids(self):
        """The depths as the model's ``position_ids``: int64 [1, rows]."""
        return self.positions.to(torch.int64).unsqueeze(0)

    @classmethod
    def from_arrays(cls, cu_seqlens, subtree_end, positions=None, *, total=None, device=None):
        """A layout from its arrays (lists, numpy arrays or tensors): piece offsets
        ``cu_seqlens`` [P + 1] (non-decreasing from 0), ``subtree_end`` [rows] and ``positions``
        [rows] (default: the depths that ``subtree_end`` implies, packsched.kernels.
        tree_position_ids). ``total``: the rows when a tail follows the last offset. ``device``:
        where the tensors go (default: subtree_end's device, else the CPU). ValueError for
        arrays of the wrong shape."""
        host = _host_ints(cu_seqlens, "cu_seqlens")
        if host.size == 0 or host[0] != 0 or np.any(np.diff(host) < 0):
            raise ValueError(
                f"TreeRows: cu_seqlens must start at 0 and be non-decreasing, got {host.tolist()}"
            )
        rows = int(host[-1]) if total is None else int(total)
        if rows < host[-1]:
            raise ValueError(f"TreeRows: total = {rows} is below the last offset {int(host[-1])}")
        if device is None:
            device = subtree_end.device if isinstance(subtree_end, torch.Tensor) else "cpu"
        ends = _host_ints(subtree_end, "subtree_end")
        if ends.size != rows:
            raise ValueError(f"TreeRows: subtree_end has {ends.size} entries for {rows} rows")
        cu_cpu = torch.as_tensor(host, dtype=torch.int32)
        ends_cpu = torch.as_tensor(ends, dtype=torch.int32)
        if positions is None:
            positions = tree_position_ids(
                cu_cpu, ends_cpu, total=total, cu_seqlens_host=host.tolist()
            )
        depths = _host_ints(positions, "positions")
        if depths.size != rows:
            raise ValueError(f"TreeRows: positions has {depths.size} entries for {rows} rows")
        return cls(
            cu_seqlens=cu_cpu.to(device),
            cu_seqlens_host=[int(x) for x in host],
            max_seqlen=int(np.diff(host).max(initial=0)),
            subtree_end=ends_cpu.to(device),
            positions=torch.as_tensor(depths, dtype=torch.int32).to(device),
            total=None if total is None else rows,
        )

    @classmethod
    def from_micro_batch(cls, micro_batch, forest, device=None):
        """The layout of ``micro_batch`` (a ``packsched.tree.TreeMicroBatch`` of a plan over
        ``forest``): its pieces at their aligned offsets, the rows' depths and subtree ends
        (``TreeMicroBatch.rows``), its tail past the aligned pieces (``meta.total``). The packed
        token ids are ``micro_batch.input_ids(forest)``."""
        meta = micro_batch.meta
        positions, subtree_end = micro_batch.rows(forest)
        cu = list(meta.cu_seqlens_aligned)
        total = int(meta.total) if int(meta.total) != cu[-1] else None
        return cls.from_arrays(cu, subtree_end, positions, total=total, device=device)

    def to(self, device):
        """The same layout with its tensors on ``device``."""
        return TreeRows(
            self.cu_seqlens.to(device),
            self.cu_seqlens_host,
            self.max_seqlen,
            self.subtree_end.to(device),
            self.positions.to(device),
            self.total,
        )
