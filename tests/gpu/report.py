#!/usr/bin/env python3
"""Judges the GPU kit's step outputs and writes the results (tests/gpu/README.md).

    report.py --work WORK --kit KIT --out OUT [--sanitizer PATH]
    report.py --validate OUT/gpu-results.json

Contract: reads what run.sh left in WORK (steps/*.json: each step's status, rc, seconds; logs/*.log;
data/*.json: gtest, Google Benchmark, nccl_probe and attention_vs_torch outputs) and writes three
files into OUT: gpu-results.json (schema below and in the README), gpu-results.md (a short
table) and gpu-run.log (every step's log, each cut to its last 200 kB). Every check gets a status
-- "pass", "fail" or "unavailable" -- and a reason, whatever happened to the others. Standard
library only. Exit 0 when the files were written. --validate checks a gpu-results.json against
the schema (every check present, statuses from the vocabulary, reasons non-empty) and exits 1 on
a violation.

gpu-results.json: {"schema": 1, "created", "kit": {...}, "machine": {...}, "elapsed_s",
"summary": {"pass", "fail", "unavailable"}, "checks": [{"id", "title", "status", "reason",
"metrics": {...}}], "steps": [{"name", "status", "rc", "seconds", "limit_s"}]}.
"""

import argparse
import datetime
import glob
import json
import math
import os
import re
import sys

SCHEMA = 1
STATUSES = ("pass", "fail", "unavailable")
# (id, title): every check of gpu-results.json, in order.
CHECKS = [
    ("kit_loads", "kit binaries load with the kit's libraries"),
    ("python_module", "packsched._kernels built from the kernels-only CMake path"),
    (
        "kernels_cuda_test",
        "CUDA kernel tests: unpad/pad, pack_aligned + tail, positions, labels, CE",
    ),
    ("kernels_attention_cuda_test", "CUDA attention: fwd/bwd, causal, window, GQA, tail, row map"),
    ("memcheck_kernels", "compute-sanitizer memcheck: kernel tests"),
    ("memcheck_attention", "compute-sanitizer memcheck: small attention cases"),
    ("racecheck_attention", "compute-sanitizer racecheck: one attention case"),
    ("attention_error", "attention error vs torch bf16 (FlashAttention's 2x rule)"),
    ("attention_throughput", "attention speed vs varlen_attn (reported, not a target)"),
    ("attention_speed_targets", "tensor-core attention: fwd >= 50%, bwd >= 40% of varlen_attn"),
    ("tree_vs_flex", "tree attention vs FlexAttention: errors (2x rule), speed reported"),
    ("tree_vs_flat", "tree-packed vs flat bf16 rollouts: log-probs and gradients (2x rule)"),
    ("packing_bandwidth", "unpad/pad/pack bandwidth as a fraction of a device copy"),
    ("collective_nccl_test", "NCCL backend test (one rank)"),
    ("nccl_round", "NCCL: a planning round on the GPU and its latency"),
    ("nccl_memory", "NCCL: CUDA context memory the sidecar's NCCL costs (reported)"),
    ("nccl_two_communicators", "NCCL: two communicators in one process on one GPU"),
    ("attention_bench", "attention_bench on the GPU (reported)"),
]
PACKING_TARGET = 0.70  # unpad and pad, at hidden 4096: at least this fraction of the copy
ERROR_FACTOR = 2.0  # FlashAttention's rule: at most 2x torch's own bf16 error
# The tensor-core attention's throughput as a fraction of varlen_attn's, at least.
SPEED_TARGETS = {"fwd": 0.50, "bwd": 0.40}
LOG_TAIL_BYTES = 200_000


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


class Inputs:
    """What run.sh left in WORK."""

    def __init__(self, work):
        self.work = work
        self.steps = {}
        for path in sorted(glob.glob(os.path.join(work, "steps", "*.json"))):
            step = load_json(path)
            if step:
                self.steps[step["name"]] = step

    def step(self, name):
        return self.steps.get(name)

    def log(self, name):
        return read_text(os.path.join(self.work, "logs", f"{name}.log")) or ""

    def data(self, name):
        """data/NAME.json; for a file with other lines too (a library's log on stdout), the
        last line that is a JSON object."""
        path = os.path.join(self.work, "data", f"{name}.json")
        found = load_json(path)
        if found is None:
            for line in reversed((read_text(path) or "").splitlines()):
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except ValueError:
                        break
        return found


def finite(value):
    """`value` with every non-finite float replaced by its name ("inf", "nan"): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def check(status, reason, **metrics):
    return {"status": status, "reason": reason, "metrics": metrics}


def not_run(inputs, name):
    """The check for a step that did not run or did not finish, else None."""
    step = inputs.step(name)
    if step is None:
        return check("unavailable", f"step {name} did not run")
    if step["status"] == "missing":
        return check("unavailable", f"step {name}: its binary is not in the kit")
    if step["status"] == "skipped":
        return check("unavailable", f"step {name} skipped: out of the time budget")
    if step["status"] == "not_selected":
        return check("unavailable", f"step {name} not selected (PACKSCHED_GPU_KIT_STEPS)")
    if step["status"] == "timeout":
        return check("fail", f"step {name} timed out after {step['seconds']} s")
    return None


def last_lines(text, n=3):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-400:]


def judge_kit_loads(inputs):
    early = not_run(inputs, "preflight")
    if early:
        return early
    lines = re.findall(r"^kit-load (\S+) (ok|fail.*)$", inputs.log("preflight"), re.MULTILINE)
    if not lines:
        return check("unavailable", "preflight printed no kit-load lines")
    failed = [f"{name}: {what}" for name, what in lines if what != "ok"]
    if failed:
        return check("fail", "; ".join(failed)[:600], loaded=len(lines) - len(failed))
    return check("pass", f"{len(lines)} binaries load", loaded=len(lines))


def judge_python_module(inputs):
    early = not_run(inputs, "build_module")
    if early:
        return early
    step = inputs.step("build_module")
    if step["rc"] != 0:
        return check(
            "fail", f"build_module.sh rc={step['rc']}: {last_lines(inputs.log('build_module'))}"
        )
    cuda = re.search(r"built_with_cuda: (\w+)", inputs.log("build_module"))
    return check(
        "pass", f"built in {step['seconds']} s", built_with_cuda=cuda and cuda.group(1) == "True"
    )


def judge_gtest(inputs, name):
    """A gtest binary: every test passed, and none meant for a device was skipped."""
    early = not_run(inputs, name)
    if early:
        return early
    step = inputs.step(name)
    report = inputs.data(name)
    if report is None:
        return check("fail", f"rc={step['rc']}, no gtest JSON: {last_lines(inputs.log(name))}")
    failed, skipped, passed = [], [], 0
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            full = f"{suite['name']}.{test['name']}"
            if test.get("failures"):
                failed.append(full)
            elif test.get("result") == "SKIPPED" or test.get("status") == "NOTRUN":
                # The "...Without(Device|AGpu)..." tests skip when a device is present, as they
                # should; every other test is meant for the device.
                if "Without" not in full:
                    skipped.append(full)
            else:
                passed += 1
    metrics = {"passed": passed, "failed": len(failed), "skipped": len(skipped)}
    if failed or step["rc"] != 0:
        detail = ", ".join(failed) or last_lines(inputs.log(name))
        return check("fail", f"rc={step['rc']}; failed: {detail}"[:600], **metrics)
    if skipped:
        return check("fail", f"skipped (no device seen?): {', '.join(skipped)}"[:600], **metrics)
    if passed == 0:
        return check("fail", "no test ran", **metrics)
    return check("pass", f"{passed} tests passed in {step['seconds']} s", **metrics)


def judge_sanitizer(inputs, name, sanitizer):
    if not sanitizer:
        return check("unavailable", "compute-sanitizer not found")
    step = inputs.step(name)
    if step is None or step["status"] in ("missing", "skipped", "not_selected"):
        return not_run(inputs, name)
    text = inputs.log(name)
    if step["status"] == "timeout":
        return check("unavailable", f"timed out after {step['seconds']} s under the sanitizer")
    memcheck = re.search(r"ERROR SUMMARY: (\d+) error", text)
    racecheck = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?", text)
    if memcheck is None and racecheck is None:
        return check("unavailable", f"no sanitizer summary (could not attach?): {last_lines(text)}")
    errors = int(memcheck.group(1)) if memcheck else int(racecheck.group(2))
    found = f"{errors} errors" + (f", {racecheck.group(1)} hazards" if racecheck else "")
    tests_ok = bool(re.search(r"\[  PASSED  \] \d+ test", text)) and "[  FAILED  ]" not in text
    metrics = {"errors": errors, "seconds": step["seconds"]}
    if racecheck:
        metrics["hazards"] = int(racecheck.group(1))
    if errors or step["rc"] != 0 or not tests_ok:
        reason = f"rc={step['rc']}, {found}; tests passed: {tests_ok}: {last_lines(text)}"
        return check("fail", reason[:600], **metrics)
    return check("pass", f"clean: {found}", **metrics)


def attention_data(inputs):
    """(data, early check): the attention_vs_torch JSON, or why it is not there."""
    early = not_run(inputs, "attention_vs_torch")
    data = inputs.data("attention_vs_torch")
    if data is None:
        why = (
            early["reason"] if early else f"no JSON: {last_lines(inputs.log('attention_vs_torch'))}"
        )
        return None, check(early["status"] if early else "fail", why)
    if data.get("status") == "unavailable":
        return None, check("unavailable", data.get("reason", "unavailable"))
    if not data.get("batches"):
        return None, check("fail", "; ".join(data.get("exceptions", []))[:600] or "no batch")
    return data, None


def judge_attention_error(inputs):
    data, early = attention_data(inputs)
    if early:
        return early
    bad, worst, worst_onepass, metrics = [], 0.0, 0.0, {}
    for batch in data["batches"]:
        for tensor, entry in batch["error"].items():
            base = entry.get("baseline")
            if base is None:
                return check(
                    "unavailable", "no torch bf16 baseline ran: " + "; ".join(batch["exceptions"])
                )
            theirs = float(entry[base])  # "inf" read as inf
            # packsched's default path, and for out each D = 128 forward tile variant; the
            # one-pass backward's errors are reported, not judged (not the default path).
            ours_all = {k: float(v) for k, v in entry.items() if k.startswith("packsched")}
            metrics[f"{batch['tokens']}/{tensor}"] = {**ours_all, base: theirs}
            onepass = ours_all.pop("packsched_onepass", None)
            if onepass is not None:
                worst_onepass = max(worst_onepass, onepass / theirs if theirs > 0 else float("inf"))
            for name, ours in ours_all.items():
                ratio = ours / theirs if theirs > 0 else float("inf")
                worst = max(worst, ratio)
                if not ours <= ERROR_FACTOR * theirs:
                    bad.append(
                        f"{tensor} ({name}) @ {batch['tokens']} tokens: "
                        f"{ours:.3g} > 2 x {theirs:.3g}"
                    )
    metrics["worst_ratio"] = worst
    onepass_note = ""
    if any("packsched_onepass" in m for m in metrics.values() if isinstance(m, dict)):
        metrics["worst_ratio_onepass"] = worst_onepass
        onepass_note = f"; one-pass backward (not judged): worst {worst_onepass:.2f}x"
    if bad:
        return check("fail", "; ".join(bad)[:600] + onepass_note, **metrics)
    base = data["batches"][0]["error"]["out"]["baseline"]
    return check(
        "pass", f"every error within 2x {base}'s (worst {worst:.2f}x){onepass_note}", **metrics
    )


def kernel_text(kernel_ms, call, top=3):
    """The largest kernels of one profiled call: 'A 1.23, B 0.45 ms' ('' when not profiled)."""
    times = kernel_ms.get(call, {})
    largest = sorted(times.items(), key=lambda item: -item[1])[:top]
    return ", ".join(f"{name.split('<')[0]} {ms:.3g}" for name, ms in largest) + (
        " ms" if largest else ""
    )


def judge_attention_throughput(inputs):
    data, early = attention_data(inputs)
    if early:
        return early
    metrics, parts = {}, []
    for batch in data["batches"]:
        speed = batch.get("speed_vs_varlen_attn", {})
        tiles = batch.get("fwd_tile_speed_vs_varlen_attn", {})
        metrics[str(batch["tokens"])] = {
            "tflops": batch["tflops"],
            "time_ms": batch["time_ms"],
            "speed_vs_varlen_attn": speed,
            "fwd_tile_speed_vs_varlen_attn": tiles,
            "kernel_ms": batch.get("kernel_ms", {}),
        }
        if speed:
            scalar = batch["tflops"]
            tile_text = ", ".join(
                f"{name.removeprefix('packsched_fwd_tile')}-row tiles {ratio:.3f}x"
                for name, ratio in sorted(tiles.items())
            )
            parts.append(
                f"{batch['tokens']} tokens: fwd {speed.get('fwd', float('nan')):.3f}x"
                + (f" ({tile_text})" if tile_text else "")
                + f", bwd {speed.get('bwd', float('nan')):.3f}x, "
                f"bwd one-pass {speed.get('bwd_onepass', float('nan')):.3f}x (scalar kernels: "
                f"{scalar['fwd'].get('packsched_scalar', float('nan')):.3g} / "
                f"{scalar['bwd'].get('packsched_scalar', float('nan')):.3g} TFLOP/s)"
            )
            kernels = batch.get("kernel_ms", {})
            for call in ("fwd packsched", "bwd packsched", "bwd packsched_onepass"):
                if kernels.get(call):
                    parts[-1] += f"; {call} kernels: {kernel_text(kernels, call)}"
    metrics["table_entries"] = data.get("table_entries", [])
    if not parts:
        return check("unavailable", "varlen_attn not timed", **metrics)
    return check("pass", "speed vs varlen_attn: " + "; ".join(parts), **metrics)


def judge_attention_speed_targets(inputs):
    """Every timed batch: packsched's throughput (its default path: the tensor-core kernels for
    bf16, D = 128) at least SPEED_TARGETS of varlen_attn's, forward and backward."""
    data, early = attention_data(inputs)
    if early:
        return early
    bad, metrics = [], {}
    for batch in data["batches"]:
        speed = batch.get("speed_vs_varlen_attn", {})
        for direction, target in SPEED_TARGETS.items():
            if direction not in speed:
                continue
            metrics[f"{batch['tokens']}/{direction}"] = speed[direction]
            if not speed[direction] >= target:
                bad.append(
                    f"{direction} @ {batch['tokens']} tokens: {speed[direction]:.3f}x < {target}x"
                )
    if not metrics:
        return check("unavailable", "varlen_attn or packsched not timed")
    if bad:
        return check("fail", "; ".join(bad), **metrics)
    return check("pass", "every timed batch meets fwd >= 0.5x, bwd >= 0.4x", **metrics)


def judge_tree_vs_flex(inputs):
    """packsched's tree attention errors at most ERROR_FACTOR x FlexAttention's (the same
    float64 reference), every batch and tensor; the times, the speed against FlexAttention
    with and without its mask build and the rows for docs/benchmarks.md reported."""
    early = not_run(inputs, "tree_vs_flex")
    data = inputs.data("tree_vs_flex")
    if data is None:
        why = early["reason"] if early else f"no JSON: {last_lines(inputs.log('tree_vs_flex'))}"
        return check(early["status"] if early else "fail", why)
    if data.get("status") == "unavailable":
        return check("unavailable", data.get("reason", "unavailable"))
    if not data.get("batches"):
        return check("fail", "; ".join(data.get("exceptions", []))[:600] or "no batch")
    bad, parts, metrics = [], [], {}
    for batch in data["batches"]:
        label = f"{batch['name']} @ {batch['tokens']}"
        for tensor, entry in batch["error"].items():
            ours, theirs = float(entry.get("packsched", "nan")), float(entry.get("flex", "nan"))
            if math.isnan(theirs):
                continue  # FlexAttention did not give this tensor (no backward on the CPU)
            if not ours <= ERROR_FACTOR * theirs:
                bad.append(f"{tensor} @ {label}: {ours:.3g} > 2 x {theirs:.3g}")
        speed = batch.get("speed_vs_flex", {})
        metrics[label] = {
            "fwd_bwd_ms": batch.get("fwd_bwd_ms", {}),
            "mask_ms": batch["time_ms"]["fwd"].get("mask"),
            "speed_vs_flex": speed,
            "tree_vs_causal_per_useful_flop": batch.get("tree_vs_causal_per_useful_flop", {}),
        }
        if "flex_with_mask" in speed:
            parts.append(
                f"{label}: flex {speed.get('flex', float('nan')):.2f}x, "
                f"with its mask {speed['flex_with_mask']:.2f}x packsched's time"
            )
    metrics["rows"] = data.get("rows", [])
    metrics["table_entries"] = data.get("table_entries", [])
    if bad:
        return check("fail", "; ".join(bad)[:600], **metrics)
    return check(
        "pass",
        "errors within 2x FlexAttention's" + (("; " + "; ".join(parts)) if parts else ""),
        **metrics,
    )


def judge_tree_vs_flat(inputs):
    """The tree-packed bf16 run's errors against the float64 reference (log-probabilities and
    gradients of the same rollouts) at most its FACTOR x the flat bf16 run's plus its floor
    (tests/gpu/tree_vs_flat.py has the rule and its reasons)."""
    early = not_run(inputs, "tree_vs_flat")
    data = inputs.data("tree_vs_flat")
    if data is None:
        why = early["reason"] if early else f"no JSON: {last_lines(inputs.log('tree_vs_flat'))}"
        return check(early["status"] if early else "fail", why)
    if data.get("status") != "ok":
        return check(
            "unavailable" if data.get("status") == "unavailable" else "fail",
            data.get("reason", "no figures")[:600],
        )
    bad, parts = [], []
    for what in ("logprobs", "grads"):
        tree, flat = (float(data["error"][what][run]) for run in ("tree", "flat"))
        limit = float(data["factor"]) * flat + float(data["floor"][what])
        parts.append(f"{what}: tree {tree:.3g}, flat {flat:.3g}, limit {limit:.3g}")
        if not tree <= limit:
            bad.append(f"{what}: tree error {tree:.3g} > {limit:.3g}")
    metrics = {k: data.get(k) for k in ("device_name", "rollouts", "rows", "error", "tree_vs_flat")}
    if bad:
        return check("fail", "; ".join(bad), **metrics)
    return check("pass", "; ".join(parts), **metrics)


def judge_packing(inputs):
    early = not_run(inputs, "kernels_bench")
    data = inputs.data("kernels_bench")
    if data is None:
        return early or check(
            "fail", f"no benchmark JSON: {last_lines(inputs.log('kernels_bench'))}"
        )
    rates = {}
    errors = []
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            errors.append(f"{b['name']}: {b.get('error_message')}")
            continue
        match = re.match(r"BM_(\w+)/Cuda/hidden:(\d+)", b["name"])
        if match and "bytes_per_second" in b:
            rates[(match.group(1), int(match.group(2)))] = b["bytes_per_second"]
    if errors and not rates:
        return check("unavailable" if "no CUDA device" in errors[0] else "fail", errors[0])
    metrics, bad = {}, []
    for (kernel, hidden), rate in sorted(rates.items()):
        copy = rates.get(("DeviceCopy", hidden))
        if kernel == "DeviceCopy" or not copy:
            continue
        fraction = rate / copy
        metrics[f"{kernel}/{hidden}"] = {"GBps": rate / 1e9, "of_copy": fraction}
        if kernel in ("Unpad", "Pad") and hidden == 4096 and fraction < PACKING_TARGET:
            bad.append(f"{kernel} {fraction:.2f}")
    for hidden in (512, 4096):
        if ("DeviceCopy", hidden) in rates:
            metrics[f"DeviceCopy/{hidden}"] = {"GBps": rates[("DeviceCopy", hidden)] / 1e9}
    if not any(k.startswith(("Unpad/4096", "Pad/4096")) for k in metrics):
        return check("fail", "unpad/pad at hidden 4096 or the copy not measured", **metrics)
    summary = ", ".join(
        f"{k} {v['of_copy']:.2f}" for k, v in metrics.items() if "of_copy" in v and "/4096" in k
    )
    if bad:
        return check("fail", f"below {PACKING_TARGET:.0%} of the copy: {', '.join(bad)}", **metrics)
    return check("pass", f"of the device copy at hidden 4096: {summary}", **metrics)


def probe_data(inputs):
    early = not_run(inputs, "nccl_probe")
    data = inputs.data("nccl_probe")
    if data is None:
        why = early["reason"] if early else f"no JSON: {last_lines(inputs.log('nccl_probe'))}"
        return None, check("unavailable" if early else "fail", why)
    if not data.get("gpu", False):
        return None, check("unavailable", data.get("error", "no GPU seen by the probe"))
    return data, None


def judge_nccl_round(inputs):
    data, early = probe_data(inputs)
    if early:
        return early
    if "error" in data:
        return check("fail", data["error"][:600])
    round_ = data.get("round", {})
    metrics = {
        "round": round_,
        "failed_round": data.get("failed_round", {}),
        "init_ms": data.get("init_ms"),
        "nccl_version": data.get("nccl_version"),
    }
    problems = [
        data[k] for k in ("collectives_error", "round_error", "failed_round_error") if k in data
    ]
    if problems or not data.get("collectives_ok"):
        return check("fail", "; ".join(problems)[:600] or "collectives wrong", **metrics)
    return check(
        "pass",
        f"round p50 {round_.get('p50_us', float('nan')):.1f} us, p99 "
        f"{round_.get('p99_us', float('nan')):.1f} us over {round_.get('count')} rounds",
        **metrics,
    )


def judge_nccl_memory(inputs):
    data, early = probe_data(inputs)
    if early:
        return early
    mib = 2**20
    stages = [
        "memory_before_cuda",
        "memory_after_context",
        "memory_after_init",
        "memory_after_rounds",
    ]
    metrics = {s: data.get(s) for s in stages if s in data}

    def used(stage, key):
        value = (data.get(stage) or {}).get(key, -1)
        return value if value is not None and value >= 0 else None

    parts = []
    before, ctx = used("memory_before_cuda", "nvml_used_bytes"), used(
        "memory_after_context", "nvml_used_bytes"
    )
    if before is not None and ctx is not None:
        metrics["context_mib"] = (ctx - before) / mib
        parts.append(f"context {(ctx - before) / mib:.0f} MiB")
    for key in ("nvml_used_bytes", "cuda_used_bytes"):
        base, after = used("memory_after_context", key), used("memory_after_rounds", key)
        if base is not None and after is not None:
            metrics["nccl_mib"] = (after - base) / mib
            parts.append(f"NCCL {(after - base) / mib:.0f} MiB more ({key.split('_')[0]})")
            break
    if not parts:
        return check("unavailable", "no memory figure (NVML and cudaMemGetInfo failed)", **metrics)
    return check("pass", ", ".join(parts), **metrics)


def judge_two_communicators(inputs):
    data, early = probe_data(inputs)
    if early:
        return early
    two = data.get("two_communicators")
    if not two:
        return check("unavailable", "the probe did not get that far")
    if two.get("ok"):
        return check("pass", "two ranks on one GPU reduced correctly", **two)
    return check(
        "unavailable", f"refused (NCCL allows one rank per GPU): {two.get('rank0')}"[:600], **two
    )


def judge_attention_bench(inputs):
    early = not_run(inputs, "attention_bench")
    data = inputs.data("attention_bench")
    if data is None:
        return early or check(
            "fail", f"no benchmark JSON: {last_lines(inputs.log('attention_bench'))}"
        )
    metrics, errors = {}, []
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            errors.append(f"{b['name']}: {b.get('error_message')}")
        else:
            metrics[b["name"]] = {
                "tokens_per_s": b.get("items_per_second"),
                "TFLOPs": b.get("TFLOPs"),
            }
    if not metrics:
        return check(
            "unavailable" if errors and "no CUDA device" in errors[0] else "fail",
            (errors or ["no benchmark ran"])[0],
        )
    return check(
        "pass",
        f"{len(metrics)} cases measured" + (f"; {len(errors)} failed" if errors else ""),
        **metrics,
    )


def judge_all(inputs, sanitizer):
    judges = {
        "kit_loads": lambda: judge_kit_loads(inputs),
        "python_module": lambda: judge_python_module(inputs),
        "kernels_cuda_test": lambda: judge_gtest(inputs, "kernels_cuda_test"),
        "kernels_attention_cuda_test": lambda: judge_gtest(inputs, "kernels_attention_cuda_test"),
        "memcheck_kernels": lambda: judge_sanitizer(inputs, "memcheck_kernels", sanitizer),
        "memcheck_attention": lambda: judge_sanitizer(inputs, "memcheck_attention", sanitizer),
        "racecheck_attention": lambda: judge_sanitizer(inputs, "racecheck_attention", sanitizer),
        "attention_error": lambda: judge_attention_error(inputs),
        "attention_throughput": lambda: judge_attention_throughput(inputs),
        "attention_speed_targets": lambda: judge_attention_speed_targets(inputs),
        "tree_vs_flex": lambda: judge_tree_vs_flex(inputs),
        "tree_vs_flat": lambda: judge_tree_vs_flat(inputs),
        "packing_bandwidth": lambda: judge_packing(inputs),
        "collective_nccl_test": lambda: judge_gtest(inputs, "collective_nccl_test"),
        "nccl_round": lambda: judge_nccl_round(inputs),
        "nccl_memory": lambda: judge_nccl_memory(inputs),
        "nccl_two_communicators": lambda: judge_two_communicators(inputs),
        "attention_bench": lambda: judge_attention_bench(inputs),
    }
    checks = []
    for check_id, title in CHECKS:
        try:
            result = judges[check_id]()
        except Exception as e:  # noqa: BLE001 - one broken judge must not hide the others
            result = check("fail", f"report.py could not judge it: {type(e).__name__}: {e}")
        checks.append({"id": check_id, "title": title, **result})
    return checks


def machine_info(inputs):
    text = inputs.log("preflight")

    def section(name):
        match = re.search(
            rf"^== {name}\n(.*?)(?=^== |^kit-load |\Z)", text, re.MULTILINE | re.DOTALL
        )
        return match.group(1).strip()[:300] if match else None

    gpu = re.search(r"^\|\s+\d+\s+(NVIDIA [^|]*?)\s{2,}", text, re.MULTILINE)
    driver = re.search(r"Driver Version: (\S+)", text)
    return {
        "gpu": gpu.group(1).strip() if gpu else None,
        "driver": driver.group(1) if driver else None,
        "python": section("python"),
        "torch": section("torch"),
        "glibc": section("glibc"),
        "nvcc": section("nvcc"),
    }


def write_markdown(results, path):
    lines = [
        f"GPU check, {results['created']} — {results['machine'].get('gpu') or 'GPU unknown'}, "
        f"kit {str(results['kit'].get('git_commit'))[:10]}: {results['summary']['pass']} pass, "
        f"{results['summary']['fail']} fail, {results['summary']['unavailable']} unavailable "
        f"({results['elapsed_s']} s)",
        "",
        "| check | status | result |",
        "|---|---|---|",
    ]
    for c in results["checks"]:
        reason = c["reason"].replace("|", "/").replace("\n", " ")
        lines.append(f"| {c['title']} | {c['status']} | {reason[:240]} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_log(work, path):
    with open(path, "w", errors="replace") as out:
        for log in sorted(glob.glob(os.path.join(work, "logs", "*.log"))):
            text = read_text(log) or ""
            cut = len(text) > LOG_TAIL_BYTES
            out.write(f"===== {os.path.basename(log)}" + (" (last 200 kB)" if cut else "") + "\n")
            out.write(text[-LOG_TAIL_BYTES:] + "\n")


def validate(path):
    """Problems of a gpu-results.json against the schema ([] when it follows it)."""
    results = load_json(path)
    if results is None:
        return [f"{path}: not JSON"]
    problems = []
    for key in ("schema", "created", "kit", "machine", "elapsed_s", "summary", "checks", "steps"):
        if key not in results:
            problems.append(f"missing key {key}")
    if results.get("schema") != SCHEMA:
        problems.append(f"schema {results.get('schema')} != {SCHEMA}")
    ids = [c.get("id") for c in results.get("checks", [])]
    if ids != [check_id for check_id, _ in CHECKS]:
        problems.append(f"checks {ids} differ from {[i for i, _ in CHECKS]}")
    for c in results.get("checks", []):
        if c.get("status") not in STATUSES:
            problems.append(f"{c.get('id')}: status {c.get('status')!r}")
        if not c.get("reason"):
            problems.append(f"{c.get('id')}: no reason")
        if not isinstance(c.get("metrics"), dict):
            problems.append(f"{c.get('id')}: metrics is not an object")
    counts = {s: sum(c.get("status") == s for c in results.get("checks", [])) for s in STATUSES}
    if results.get("summary") != counts:
        problems.append(f"summary {results.get('summary')} != {counts}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work")
    parser.add_argument("--kit")
    parser.add_argument("--out")
    parser.add_argument("--sanitizer", default="")
    parser.add_argument("--elapsed-s", type=int, default=None)
    parser.add_argument("--validate", metavar="JSON")
    args = parser.parse_args()
    if args.validate:
        problems = validate(args.validate)
        for p in problems:
            print(f"report.py --validate: {p}")
        return 1 if problems else 0
    if not (args.work and args.kit and args.out):
        parser.error("--work, --kit and --out are required")
    inputs = Inputs(args.work)
    checks = judge_all(inputs, args.sanitizer)
    manifest = load_json(os.path.join(args.kit, "manifest.json")) or {}
    results = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kit": {
            k: manifest.get(k) for k in ("git_commit", "git_dirty", "created", "cuda_architectures")
        },
        "machine": machine_info(inputs),
        "elapsed_s": args.elapsed_s
        if args.elapsed_s is not None
        else sum(s.get("seconds") or 0 for s in inputs.steps.values()),
        "summary": {s: sum(c["status"] == s for c in checks) for s in STATUSES},
        "checks": checks,
        "steps": [inputs.steps[name] for name in sorted(inputs.steps)],
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu-results.json"), "w") as f:
        json.dump(finite(results), f, indent=1, allow_nan=False, default=str)
        f.write("\n")
    write_markdown(results, os.path.join(args.out, "gpu-results.md"))
    write_log(args.work, os.path.join(args.out, "gpu-run.log"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
