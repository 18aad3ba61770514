"""The GPU kit's tree_vs_flex step (tests/gpu/tree_vs_flex.py) without a GPU: the tree layouts it
builds, its tiny CPU self-test end to end (packsched's tree attention and FlexAttention's forward
against the float64 reference), the rows and table entries it emits, and report.py's judgement."""

import json
import pathlib
import subprocess
import sys
import types

GPU = pathlib.Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU))

import report  # noqa: E402
import tree_vs_flex  # noqa: E402

from packsched import _attention_backends  # noqa: E402


def test_layout_rows_follow_the_preorder():
    # A prompt of 2 rows with children of 1 and 3 rows; then a chain with a side branch.
    cu, subtree_end, depth = tree_vs_flex.layout_of(
        [([2, 1, 3], [-1, 0, 0]), ([1, 1, 1, 1], [-1, 0, 1, 0])]
    )
    assert cu == [0, 6, 10]
    assert subtree_end == [6, 6, 3, 6, 6, 6] + [10, 9, 9, 10]
    assert depth == [0, 1, 2, 2, 3, 4] + [0, 1, 2, 1]


def test_batches_fill_their_target_and_keep_parents():
    for kind, n in tree_vs_flex.KINDS:
        name, trees = tree_vs_flex.make_batch(kind, n, 32768, seed=5)
        tokens = sum(sum(lengths) for lengths, _ in trees)
        assert 32768 - 2000 < tokens <= 32768, (name, tokens)
        for lengths, parents in trees:
            assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
        if kind == "grpo":
            assert all(len(p) - 1 <= n for _, p in trees) and len(trees[0][1]) - 1 == n


def test_cpu_self_test_writes_errors_times_and_rows(tmp_path):
    out = tmp_path / "tree_vs_flex.json"
    subprocess.run(
        [sys.executable, str(GPU / "tree_vs_flex.py"), "--out", str(out), "--cpu-self-test"],
        check=True,
        timeout=120,
    )
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and not data["exceptions"]
    assert [b["name"] for b in data["batches"]] == [
        "GRPO n = 8",
        "GRPO n = 16",
        "multi-turn, depth 3",
    ]
    for batch in data["batches"]:
        for tensor, entry in batch["error"].items():
            assert entry["packsched"] < 1e-5, (batch["name"], tensor)
        assert batch["error"]["out"]["flex"] < 1e-5
        assert batch["error"]["out"]["packsched"] <= 2 * batch["error"]["out"]["flex"] + 1e-6
        assert batch["tree_pairs"] < batch["causal_pairs"]  # branches do not see each other
        assert {"packsched", "flex", "mask", "packsched_causal"} <= set(batch["time_ms"]["fwd"])
    assert len(data["rows"]) == 3 and all(r.startswith("| ") for r in data["rows"])


def timed_batch(name, tokens, packsched_ms, flex_ms, mask_ms):
    batch = {
        "name": name,
        "tokens": tokens,
        "pieces": 2,
        "time_ms": {
            "fwd": {"packsched": packsched_ms / 2, "flex": flex_ms / 2, "mask": mask_ms},
            "bwd": {"packsched": packsched_ms / 2, "flex": flex_ms / 2},
        },
        "tflops": {"fwd": {}, "bwd": {}},
        "error": {
            "out": {"packsched": 1e-3, "flex": 1e-3, "baseline": "flex"},
            "dq": {"packsched": 3e-3, "flex": 1e-3, "baseline": "flex"},
        },
    }
    tree_vs_flex.summarize(batch)
    return batch


def test_table_entries_order_backends_by_time_with_the_mask_build():
    batches = [
        timed_batch("GRPO n = 8", 32700, 4.0, 3.0, 2.0),  # flex 5.0 with its mask
        timed_batch("GRPO n = 16", 32000, 4.0, 3.0, 0.5),  # 3.5
        timed_batch("multi-turn", 65000, 9.0, 6.0, 1.0),  # 7.0
    ]
    entries = tree_vs_flex.table_entries(batches, "cuda:sm_90", "bfloat16", 128)
    assert [(e["tokens_bucket"], e["backends"]) for e in entries] == [
        (32768, ["packsched", "flex"]),  # 8.0 against 8.5
        (65536, ["flex", "packsched"]),
    ]
    table = _attention_backends.check_table({"entries": entries})
    call = _attention_backends.Call("cuda:sm_90", "bfloat16", 128, "tree", 60000)
    assert _attention_backends.lookup(table, call)[1] is entries[1]
    assert "| 4.00 | 3.00 | 2.00 | 5.00 | 1.25x |" in tree_vs_flex.doc_row(batches[0])


def test_report_judges_errors_by_the_2x_rule(monkeypatch):
    good = [timed_batch("GRPO n = 8", 32700, 4.0, 3.0, 2.0)]
    good[0]["error"]["dq"]["packsched"] = 2e-3
    bad = [timed_batch("GRPO n = 8", 32700, 4.0, 3.0, 2.0)]  # dq 3x FlexAttention's

    def inputs(batches):
        data = {"status": "ok", "batches": batches, "rows": [], "table_entries": []}
        step = {"name": "tree_vs_flex", "status": "ran", "rc": 0, "seconds": 1}
        return types.SimpleNamespace(
            step=lambda name: step, data=lambda name: data, log=lambda name: ""
        )

    verdict = report.judge_tree_vs_flex(inputs(good))
    assert verdict["status"] == "pass" and "with its mask 1.25x" in verdict["reason"]
    verdict = report.judge_tree_vs_flex(inputs(bad))
    assert verdict["status"] == "fail" and verdict["reason"].startswith("dq @ GRPO n = 8")
