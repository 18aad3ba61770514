"""3-D rotary position ids (packsched.kernels.mrope_position_ids) against an independent float64
implementation of the published rule, Hugging Face transformers' Qwen2-VL get_rope_index: per
sequence, text runs count on from the previous block's largest position + 1 on all three rows;
an image or video grid (t, h, w) with merge size m places (t, h/m, w/m) indices on the three rows,
offset by where the text before it ended. The reference works from token ids (image and video
pad ids, separate image and video grid lists, as HF's does), the kernel from token types and one
grid list in order of appearance."""

import pytest
import torch

from packsched import kernels

TEXT, IMAGE, VIDEO = 5, 151655, 151656  # token ids (any distinct values)


def reference_positions(ids, image_grids, video_grids, merge):
    """float64 [3, L] for one sequence, following get_rope_index's documented procedure."""
    ids = list(ids)
    blocks, start, img, vid = [], 0, 0, 0
    while True:
        nxt_img = ids.index(IMAGE, start) if IMAGE in ids[start:] else len(ids) + 1
        nxt_vid = ids.index(VIDEO, start) if VIDEO in ids[start:] else len(ids) + 1
        if min(nxt_img, nxt_vid) > len(ids):
            break
        if nxt_img < nxt_vid:
            (t, h, w), end = image_grids[img], nxt_img
            img += 1
        else:
            (t, h, w), end = video_grids[vid], nxt_vid
            vid += 1
        gh, gw = h // merge, w // merge
        base = float(blocks[-1].max() + 1) if blocks else 0.0
        text = end - start
        blocks.append(torch.arange(text, dtype=torch.float64).expand(3, -1) + base)
        ti = torch.arange(t, dtype=torch.float64).view(-1, 1).expand(-1, gh * gw).flatten()
        hi = torch.arange(gh, dtype=torch.float64).view(1, -1, 1).expand(t, -1, gw).flatten()
        wi = torch.arange(gw, dtype=torch.float64).view(1, 1, -1).expand(t, gh, -1).flatten()
        blocks.append(torch.stack([ti, hi, wi]) + text + base)
        start = end + t * gh * gw
    if start < len(ids):
        base = float(blocks[-1].max() + 1) if blocks else 0.0
        blocks.append(torch.arange(len(ids) - start, dtype=torch.float64).expand(3, -1) + base)
    return torch.cat(blocks, dim=1) if blocks else torch.zeros(3, 0, dtype=torch.float64)


def sequence(parts, merge):
    """parts: "text:N", ("image", t, h, w) or ("video", t, h, w) -> ids, images, videos."""
    ids, images, videos = [], [], []
    for p in parts:
        if isinstance(p, int):
            ids += [TEXT] * p
        else:
            kind, t, h, w = p
            ids += [IMAGE if kind == "image" else VIDEO] * (t * (h // merge) * (w // merge))
            (images if kind == "image" else videos).append((t, h, w))
    return ids, images, videos


SEQUENCES = [
    [7],  # text only
    [3, ("image", 1, 4, 6), 5],  # image inside text
    [("image", 1, 2, 2), 2],  # image first
    [4, ("video", 3, 4, 4), 1],  # video: t > 1
    [2, ("image", 1, 8, 2), ("video", 2, 2, 6), 3, ("image", 1, 2, 4)],  # mixed, back to back
    [1, ("video", 5, 2, 2)],  # t larger than h, w: text after would start at + 5
    [],  # empty
]


@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("tail", [0, 5])
def test_packed_positions_equal_the_reference_per_sequence(merge, tail):
    seqs = [sequence(s, 2) for s in SEQUENCES]
    if merge == 1:  # the same layouts with merge 1: grids of half the size
        seqs = [
            (
                ids,
                [(t, h // 2, w // 2) for t, h, w in im],
                [(t, h // 2, w // 2) for t, h, w in vi],
            )
            for ids, im, vi in seqs
        ]
    types, grids, counts, cu, expected = [], [], [], [0], []
    for ids, images, videos in seqs:
        types += [0 if i == TEXT else (1 if i == IMAGE else 2) for i in ids]
        # one grid list in order of appearance: walk the ids, a vision token past the tokens of
        # the grids taken so far starts the next image or video grid
        order, end, it_images, it_videos = [], 0, iter(images), iter(videos)
        for pos, i in enumerate(ids):
            if i != TEXT and pos >= end:
                t, h, w = next(it_images) if i == IMAGE else next(it_videos)
                order.append((t, h, w))
                end = pos + t * (h // merge) * (w // merge)
        grids += order
        counts.append(len(order))
        cu.append(cu[-1] + len(ids))
        expected.append(reference_positions(ids, images, videos, merge))
    total = cu[-1] + tail
    if tail:
        types += [0] * tail
        expected.append(torch.arange(tail, dtype=torch.float64).expand(3, -1))
    pos, cu_out = kernels.mrope_position_ids(
        torch.tensor(types),
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(grids, dtype=torch.int64).reshape(-1, 3),
        counts,
        spatial_merge_size=merge,
        total=total if tail else None,
    )
    assert pos.dtype == torch.int64 and tuple(pos.shape) == (3, total)
    assert cu_out.tolist() == cu
    assert torch.equal(pos.double(), torch.cat(expected, dim=1))


def test_text_only_rows_are_plain_positions_and_restart_per_sequence():
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    pos, _ = kernels.mrope_position_ids(torch.zeros(9, dtype=torch.int32), cu, [], [0, 0])
    expected = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])
    assert torch.equal(pos, expected.expand(3, -1))
    assert torch.equal(pos[0], kernels.position_ids(cu))


def test_types_and_grids_that_disagree_are_refused():
    cu = torch.tensor([0, 6], dtype=torch.int32)
    types = torch.tensor([0, 1, 1, 0, 0, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="no grid left"):
        kernels.mrope_position_ids(types, cu, [], [0])
    with pytest.raises(ValueError, match="covers a text token"):
        kernels.mrope_position_ids(types, cu, [[1, 2, 6]], [1])
    with pytest.raises(ValueError, match="past the end"):
        kernels.mrope_position_ids(types, cu, [[2, 4, 4]], [1])
    with pytest.raises(ValueError, match="left over"):
        kernels.mrope_position_ids(types, cu, [[1, 2, 4], [1, 2, 2]], [2])
    with pytest.raises(ValueError, match="multiple of spatial_merge_size"):
        kernels.mrope_position_ids(types, cu, [[1, 3, 4]], [1])
    with pytest.raises(ValueError, match="grids_per_sequence"):
        kernels.mrope_position_ids(types, cu, [[1, 2, 4]], [1, 0])
