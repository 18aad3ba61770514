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
