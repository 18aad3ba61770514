"""The in-process planner and `packsched plan` give the identical plan for the same input."""

import json
import pathlib
import subprocess

import numpy as np
import pytest

import packsched
from packsched import planner

CLI = pathlib.Path(packsched.__file__).resolve().parents[2] / "bin" / "packsched"

CASES = [
    ({"max_token_len": 16384, "overlong": "isolate"}, {}),
    ({"max_token_len": 20000, "algorithm": "lpt", "order": "interleave"}, {}),
    ({"max_token_len": 20000, "align_to": 8, "align_total_to": 64, "divisible_by": 4}, {}),
    ({"max_token_len": 40000, "cap_mode": "padded", "max_seqs_per_micro_batch": 7}, {}),
    ({"max_token_len": 20000, "cost": "attention", "attention_cost": (4096, 1)}, {}),
    ({"max_token_len": 16384, "algorithm": "bfd", "overlong": "drop"}, {}),
    ({"max_token_len": 16384, "algorithm": "sequential", "overlong": "drop"}, {}),
    ({"max_token_len": None, "order": "index"}, {"num_parts": 37}),
    ({"max_token_len": None, "equal_size": True}, {"num_parts": 25}),
]


def cli_flags(options, extra):
    flags = []
    for name, value in {**options, **extra}.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            value = ",".join(map(str, value))
        elif isinstance(value, bool):
            value = str(value).lower()
        flags.append(f"--{name}={value}")
    return flags


@pytest.mark.parametrize("options,extra", CASES)
def test_identical_plans(tmp_path, options, extra):
    rng = np.random.default_rng(len(tmp_path.name))
    lengths = (rng.lognormal(np.log(2000), 1.0, 500).clip(50, 18000)).astype(np.int64).tolist()
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    out = subprocess.run(
        [str(CLI), "plan", f"--lengths={path}", "--format=json", *cli_flags(options, extra)],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = json.loads(out.stdout)
    kwargs = {k: v for k, v in options.items() if k != "max_token_len"}
    if "num_parts" in extra:
        plan = planner.partition(lengths, extra["num_parts"], options["max_token_len"], **kwargs)
    else:
        plan = planner.plan_local(lengths, options["max_token_len"], **kwargs)
    assert plan.num_micro_batches == expected["num_micro_batches"]
    assert plan.reorder == expected["reorder"]
    assert plan.revert == expected["revert"]
    assert plan.dropped == expected["dropped"]
    for meta, mb in zip(plan.metadata, expected["micro_batches"]):
        for field in (
            "indices",
            "tokens",
            "total",
            "cost",
            "max_seqlen",
            "cu_seqlens",
            "cu_seqlens_aligned",
            "empty",
            "overlong",
        ):
            assert getattr(meta, field) == mb[field], field
    for field, value in expected["stats"].items():
        assert getattr(plan.stats, field) == value, field


DYNAMIC_CP_CASES = [
    ({"sizes": "powers_of_two"}, (4096, 1, 300, 0, 0, 0)),
    ({"sizes": "any", "min_cp": 2, "max_cp": 6, "tensor_parallel": 2, "divisible_by": 2}, None),
    ({"sizes": "divisors", "max_cp": 4}, (1, 0, 0, 50000, 2, 7)),
]


@pytest.mark.parametrize("options,cost", DYNAMIC_CP_CASES)
def test_identical_dynamic_cp_plans(tmp_path, options, cost):
    """`plan --dynamic_cp` and packsched.dynamic_cp: the same slots, groups and names."""
    from packsched.dynamic_cp import dynamic_cp

    rng = np.random.default_rng(len(tmp_path.name) + 7)
    lengths = (rng.lognormal(np.log(3000), 1.0, 200).clip(50, 40000)).astype(np.int64).tolist()
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    ranks, cap = 12, 12000
    flags = [f"--{'cp_sizes' if k == 'sizes' else k}={v}" for k, v in options.items()]
    names = ("linear", "quadratic", "comm", "micro_batch_cost", "node_ranks", "comm_across_nodes")
    flags += [f"--cp_{n}={v}" for n, v in zip(names, cost or ())]
    out = subprocess.run(
        [
            str(CLI),
            "plan",
            "--dynamic_cp",
            f"--world_size={ranks}",
            f"--max_token_len={cap}",
            f"--lengths={path}",
            "--format=json",
            *flags,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    cli = json.loads(out.stdout)
    plan = dynamic_cp(lengths, ranks, cap, cost=cost, **options)
    assert cli["cost_model"] == list(plan.cost_model)
    assert cli["group_names"] == [list(g) for g in plan.group_names]
    assert cli["step_cost"] == plan.step_cost
    assert cli["lower_bound"] == plan.lower_bound
    assert cli["cp_of_sequence"] == plan.cp_of_sequence
    assert cli["slot_of_sequence"] == plan.slot_of_sequence
    ours = [
        [
            {k: g[k] for k in ("first_rank", "size", "name", "sequences", "cu_seqlens")}
            for g in s["groups"]
        ]
        for s in plan.slots
    ]
    theirs = [
        [
            {k: g[k] for k in ("first_rank", "size", "name", "sequences", "cu_seqlens")}
            for g in s["groups"]
        ]
        for s in cli["slots"]
    ]
    assert theirs == [
        [{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in g.items()} for g in s]
        for s in ours
    ]
