#!/usr/bin/env python3
"""Runs the real `packsched` binary and checks what it prints against the planner's guarantees.

    cli_e2e_test.py PATH/TO/packsched PATH/TO/gen_lengths.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

PACKSCHED = None
GEN_LENGTHS = None


def run(args, stdin=""):
    """(exit code, stdout, stderr) of `packsched ARGS` fed `stdin`."""
    done = subprocess.run(
        [PACKSCHED] + args, input=stdin, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


def plan_json(args, stdin):
    code, out, err = run(["plan", "--format=json"] + args, stdin)
    if code != 0:
        raise AssertionError(f"packsched {args} failed ({code}): {err}")
    return json.loads(out)  # the whole of stdout is the JSON: nothing else may be there


def gen_lengths(n, seed, fmt="lines"):
    return subprocess.run(
        [sys.executable, GEN_LENGTHS, "--n", str(n), "--seed", str(seed), "--format", fmt],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


class PlanChecks(unittest.TestCase):
    """The guarantees every plan must meet, checked from the JSON alone."""

    def check_plan(self, plan, lengths, cap=None, align_to=1):
        n = len(lengths)
        parts = plan["micro_batches"]
        self.assertEqual(plan["num_micro_batches"], len(parts))
        dropped = plan["dropped"]
        seen = []
        for part in parts:
            indices = part["indices"]
            self.assertEqual(indices, sorted(indices))
            self.assertEqual(part["empty"], not indices)
            self.assertEqual(part["tokens"], sum(lengths[i] for i in indices))
            cu = [0]
            for i in indices:
                cu.append(cu[-1] + lengths[i])
            self.assertEqual(part["cu_seqlens"], cu)
            self.assertEqual(part["max_seqlen"], max((lengths[i] for i in indices), default=0))
            aligned = sum(-(-lengths[i] // align_to) * align_to for i in indices)
            self.assertEqual(part["aligned_tokens"], aligned)
            if cap is not None and not part["overlong"]:
                self.assertLessEqual(part["total"], cap)
            if part["overlong"]:
                self.assertEqual(len(indices), 1)
                self.assertGreater(lengths[indices[0]], cap)
            seen += indices
        # Every kept index exactly once; dropped ones nowhere.
        self.assertEqual(sorted(seen + dropped), list(range(n)))
        # reorder is the parts' indices in order; revert inverts it (-1 for dropped).
        self.assertEqual(plan["reorder"], seen)
        self.assertEqual(len(plan["revert"]), n)
        for position, index in enumerate(plan["reorder"]):
            self.assertEqual(plan["revert"][index], position)
        for index in dropped:
            self.assertEqual(plan["revert"][index], -1)
        stats = plan["stats"]
        self.assertEqual(stats["num_sequences"], n)
        self.assertEqual(stats["num_kept"], n - len(dropped))
        self.assertEqual(stats["max_part_cost"], max(p["cost"] for p in parts))
        self.assertGreaterEqual(len(parts), stats["lower_bound_k"])
        if cap is not None:
            over = sum(1 for p in parts if p["total"] > cap)
            self.assertEqual(stats["over_cap_parts"], over)


class SanityExamples(PlanChecks):
    def test_eight_lengths_into_four_parts_has_largest_part_eight(self):
        lengths = [1, 2, 2, 5, 3, 7, 6, 3]
        plan = plan_json(["--num_parts=4"], json.dumps(lengths))
        self.check_plan(plan, lengths)
        self.assertEqual(plan["num_micro_batches"], 4)
        self.assertEqual(max(p["tokens"] for p in plan["micro_batches"]), 8)

    def test_six_lengths_pack_into_three_bins(self):
        lengths = [3000, 8000, 2000, 5000, 1000, 7000]
        for algorithm in ("ffd", "bfd"):
            with self.subTest(algorithm=algorithm):
                plan = plan_json(
                    [f"--algorithm={algorithm}", "--max_token_len=10240"],
                    "\n".join(map(str, lengths)),
                )
                self.check_plan(plan, lengths, cap=10240)
                self.assertEqual(plan["num_micro_batches"], 3)
                self.assertEqual(plan["options"]["mode"], "pack")


class RealisticBatches(PlanChecks):
    @classmethod
    def setUpClass(cls):
        cls.text = gen_lengths(3000, 11)
        cls.lengths = [int(line) for line in cls.text.split()]

    def test_every_balancing_and_packing_algorithm_keeps_the_guarantees(self):
        for algorithm in ("kk", "lpt", "ffd", "bfd", "sequential"):
            with self.subTest(algorithm=algorithm):
                plan = plan_json(
                    [f"--algorithm={algorithm}", "--max_token_len=16384", "--overlong=isolate"],
                    self.text,
                )
                self.check_plan(plan, self.lengths, cap=16384)
                self.assertEqual(plan["options"]["algorithm"], algorithm)

    def test_kk_is_never_worse_than_lpt(self):
        args = ["--max_token_len=16384", "--overlong=isolate"]
        kk = plan_json(args + ["--algorithm=kk"], self.text)
        lpt = plan_json(args + ["--algorithm=lpt"], self.text)
        self.assertEqual(kk["num_micro_batches"], lpt["num_micro_batches"])
        self.assertLessEqual(kk["stats"]["max_part_cost"], lpt["stats"]["max_part_cost"])

    def test_drop_leaves_overlong_sequences_out(self):
        plan = plan_json(["--max_token_len=16384", "--overlong=drop"], self.text)
        self.check_plan(plan, self.lengths, cap=16384)
        self.assertEqual(plan["dropped"], [i for i, n in enumerate(self.lengths) if n > 16384])
        self.assertEqual(plan["stats"]["over_cap_parts"], 0)

    def test_alignment_and_fixed_k_with_a_cap(self):
        plan = plan_json(
            ["--max_token_len=16384", "--overlong=drop", "--align_to=64", "--num_parts=700"],
            self.text,
        )
        self.check_plan(plan, self.lengths, cap=16384, align_to=64)
        self.assertEqual(plan["num_micro_batches"], 700)

    def test_json_array_input_file_and_stdin_give_the_same_plan(self):
        args = ["--max_token_len=16384", "--overlong=isolate"]
        from_lines = plan_json(args, self.text)
        from_array = plan_json(args, gen_lengths(3000, 11, "json"))
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(self.text)
        try:
            from_file = plan_json(args + [f"--lengths={f.name}"], "")
        finally:
            os.unlink(f.name)
        for plan in (from_lines, from_array, from_file):
            del plan["timing"]
        self.assertEqual(from_lines, from_array)
        self.assertEqual(from_lines, from_file)

    def test_jsonl_length_and_token_fields_give_the_plan_of_the_same_lengths(self):
        args = ["--max_token_len=16384", "--overlong=isolate"]
        lengths = [int(x) for x in self.text.split()][:500]
        records = "\n".join(
            json.dumps({"id": i, "meta": {"len": 1}, "len": n, "input_ids": list(range(n))})
            for i, n in enumerate(lengths)
        )
        expected = plan_json(args, "\n".join(map(str, lengths)))
        by_length = plan_json(args + ["--length_field=len"], records)
        by_tokens = plan_json(args + ["--token_field=input_ids"], records)
        for plan in (expected, by_length, by_tokens):
            del plan["timing"]
        self.assertEqual(by_length, expected)
        self.assertEqual(by_tokens, expected)

    def test_jsonl_errors_name_the_line_and_without_a_field_name_the_flags(self):
        code, _, err = run(["plan", "--num_parts=1", "--length_field=len"], '{"len": 3}\n{"n": 1}')
        self.assertEqual(code, 1)
        self.assertIn("stdin:2: no field 'len'", err)
        code, _, err = run(["plan", "--num_parts=1"], '{"len": 3}')
        self.assertEqual(code, 1)
        self.assertIn("--length_field=NAME", err)
        code, _, err = run(["plan", "--num_parts=1", "--length_field=a", "--token_field=b"], "")
        self.assertEqual(code, 2)

    def test_a_short_run_prints_no_progress(self):
        code, _, err = run(["plan", "--max_token_len=16384", "--overlong=isolate"], self.text)
        self.assertEqual((code, err), (0, ""))

    def test_equal_size_gives_every_part_n_over_k(self):
        plan = plan_json(["--num_parts=8", "--equal_size"], self.text)
        self.check_plan(plan, self.lengths)
        self.assertEqual({len(p["indices"]) for p in plan["micro_batches"]}, {3000 // 8})

    def test_attention_cost_is_a_l_plus_b_l_squared(self):
        plan = plan_json(
            [
                "--max_token_len=16384",
                "--overlong=isolate",
                "--cost=attention",
                "--attention_cost=3,2",
            ],
            self.text,
        )
        for part in plan["micro_batches"]:
            self.assertEqual(
                part["cost"],
                sum(3 * self.lengths[i] + 2 * self.lengths[i] ** 2 for i in part["indices"]),
            )

    def test_order_index_sorts_by_first_index(self):
        plan = plan_json(
            ["--max_token_len=16384", "--overlong=isolate", "--order=index"], self.text
        )
        firsts = [p["indices"][0] for p in plan["micro_batches"]]
        self.assertEqual(firsts, sorted(firsts))

    def test_count_and_shape_constraints(self):
        plan = plan_json(
            [
                "--max_token_len=16384",
                "--overlong=drop",
                "--divisible_by=4",
                "--min_micro_batches=3",
                "--max_seqs_per_micro_batch=3",
                "--align_total_to=128",
            ],
            self.text,
        )
        self.check_plan(plan, self.lengths, cap=16384)
        self.assertEqual(plan["num_micro_batches"] % 4, 0)
        for part in plan["micro_batches"]:
            self.assertLessEqual(len(part["indices"]), 3)
            self.assertEqual(part["total"] % 128, 0)
            self.assertGreaterEqual(part["total"], part["aligned_tokens"])

    def test_padded_cap_mode_bounds_count_times_longest(self):
        plan = plan_json(
            ["--max_token_len=16384", "--overlong=drop", "--cap_mode=padded"], self.text
        )
        self.check_plan(plan, self.lengths)
        for part in plan["micro_batches"]:
            self.assertLessEqual(len(part["indices"]) * part["max_seqlen"], 16384)
            self.assertEqual(part["padded_tokens"], len(part["indices"]) * part["max_seqlen"])

    def test_max_micro_batches_is_never_clamped(self):
        code, out, err = run(
            ["plan", "--max_token_len=16384", "--overlong=drop", "--max_micro_batches=10"],
            self.text,
        )
        self.assertNotEqual(code, 0)
        self.assertEqual(out, "")
        self.assertIn("max_micro_batches = 10", err)

    def test_table_has_a_row_per_micro_batch_and_a_summary(self):
        code, out, err = run(["plan", "--max_token_len=16384", "--overlong=isolate"], self.text)
        self.assertEqual(code, 0, err)
        self.assertEqual(err, "")
        k = plan_json(["--max_token_len=16384", "--overlong=isolate"], self.text)[
            "num_micro_batches"
        ]
        rows = [line for line in out.splitlines() if "|" in line]
        self.assertEqual(len(rows), k)
        self.assertIn(f"-> {k} micro-batches", out)
        self.assertIn("planning time", out)


class DynamicCp(unittest.TestCase):
    """`plan --dynamic_cp`: the plan's guarantees, checked from the JSON alone."""

    def plan(self, lengths, ranks, cap, *flags):
        return plan_json(
            ["--dynamic_cp", f"--world_size={ranks}", f"--max_token_len={cap}", *flags],
            "\n".join(map(str, lengths)),
        )

    def check(self, plan, lengths, ranks, cap, tp=1, divisible_by=1, sizes=None):
        seen = []
        names = {}
        self.assertEqual(plan["num_micro_batches"], len(plan["slots"]))
        self.assertEqual(len(plan["slots"]) % divisible_by, 0)
        for i, slot in enumerate(plan["slots"]):
            covered = []
            for g in slot["groups"]:
                c, first = g["size"], g["first_rank"]
                if sizes is not None:
                    self.assertIn(c, sizes)
                self.assertEqual(g["ranks"], list(range(first, first + c)))
                covered += g["ranks"]
                names.setdefault((first, c), g["name"])
                self.assertEqual(names[(first, c)], g["name"])  # one name per group, every slot
                self.assertEqual(plan["group_names"][g["name"]], [first, c])
                cu = [0]
                for s in g["sequences"]:
                    cu.append(cu[-1] + -(-lengths[s] // (2 * c * tp)) * (2 * c * tp))
                    self.assertEqual(plan["slot_of_sequence"][s], i)
                    self.assertEqual(plan["cp_of_sequence"][s], c)
                self.assertEqual(g["cu_seqlens"], cu)
                self.assertEqual(g["tokens_per_rank"] * c, cu[-1])
                self.assertLessEqual(g["tokens_per_rank"], cap)
                seen += g["sequences"]
            self.assertEqual(covered, list(range(ranks)))
            self.assertEqual(slot["cost"], max(g["cost"] for g in slot["groups"]))
        self.assertEqual(sorted(seen), list(range(len(lengths))))
        self.assertEqual(len(names), len(plan["group_names"]))
        self.assertEqual(plan["step_cost"], sum(s["cost"] for s in plan["slots"]))
        self.assertGreaterEqual(plan["step_cost"], plan["lower_bound"])

    def test_every_sequence_once_on_a_group_within_the_cap(self):
        lengths = [int(x) for x in gen_lengths(300, 31).split()]
        cap = max(lengths) // 4 + 64
        plan = self.plan(lengths, 8, cap, "--cp_quadratic=1", "--cp_comm=500")
        self.check(plan, lengths, 8, cap)
        self.assertEqual(plan["options"]["max_tokens_per_rank"], cap)
        self.assertEqual(plan["cost_model"], [1, 1, 500, 0, 0, 0])

    def test_sizes_tp_divisible_by_and_the_smallest_size(self):
        lengths = [int(x) for x in gen_lengths(120, 47).split()]
        cap = max(lengths) // 2 + 64
        flags = [
            "--cp_sizes=any",
            "--min_cp=2",
            "--max_cp=6",
            "--tensor_parallel=2",
            "--divisible_by=4",
        ]
        plan = self.plan(lengths, 12, cap, *flags)
        self.check(plan, lengths, 12, cap, tp=2, divisible_by=4, sizes={2, 3, 4, 5, 6})
        self.assertEqual(plan["options"]["sizes"], "any")

    def test_model_config_sets_the_weights(self):
        config = {
            "hidden_size": 1024,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "intermediate_size": 4096,
            "vocab_size": 32000,
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
        try:
            lengths = [int(x) for x in gen_lengths(80, 5).split()]
            cap = max(lengths) // 4 + 64
            slow = self.plan(lengths, 8, cap, f"--model_config={f.name}", "--cp_node_ranks=4")
            fast = self.plan(
                lengths,
                8,
                cap,
                f"--model_config={f.name}",
                "--cp_node_ranks=4",
                "--cp_flops_per_byte=10",
                "--cp_flops_per_byte_across_nodes=10",
            )
        finally:
            os.unlink(f.name)
        self.check(slow, lengths, 8, cap)
        self.check(fast, lengths, 8, cap)
        linear, quadratic, comm, micro_batch, nodes, across = slow["cost_model"]
        self.assertGreater(linear, 0)
        self.assertGreater(quadratic, 0)
        self.assertEqual(nodes, 4)
        self.assertEqual(across, 8 * comm)  # 8000 over 1000 FLOPs per byte, the defaults
        self.assertEqual(fast["cost_model"][:2], [linear, quadratic])
        self.assertLess(fast["cost_model"][2], comm)

    def test_table_lists_every_slot_and_the_group_names(self):
        lengths = [int(x) for x in gen_lengths(60, 9).split()]
        cap = max(lengths) // 2 + 64
        args = ["plan", "--dynamic_cp", "--world_size=4", f"--max_token_len={cap}"]
        code, out, err = run(args, "\n".join(map(str, lengths)))
        self.assertEqual(code, 0, err)
        plan = self.plan(lengths, 4, cap)
        self.assertEqual(out.count("\nslot "), plan["num_micro_batches"])
        self.assertIn(f"step cost {plan['step_cost']}", out)
        for name, (first, size) in enumerate(plan["group_names"]):
            rows = f"{first}-{first + size - 1}" if size > 1 else f"{first}"
            self.assertIn(f" {name}=[{rows}]", out)

    def test_a_sequence_over_the_cap_at_the_largest_size_exits_one_naming_it(self):
        code, out, err = run(
            ["plan", "--dynamic_cp", "--world_size=4", "--max_token_len=100", "--max_cp=2"],
            "50\n120\n401\n30\n",
        )
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(len(err.splitlines()), 1)
        self.assertIn("sequence 2 (length 401)", err)
        self.assertIn("above --max_token_len = 100", err)

    def test_options_that_cannot_split_the_ranks_are_a_usage_error(self):
        code, out, err = run(
            ["plan", "--dynamic_cp", "--world_size=6", "--max_token_len=100", "--min_cp=4"], "5\n"
        )
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--cp_sizes", err)
        self.assertIn("cannot split ranks = 6", err)

    def test_a_tiny_request_for_a_huge_plan_is_refused_at_once(self):
        # One sequence over 2^20 ranks in groups of one, 1000 slots: 10^9 groups.
        huge = ["plan", "--dynamic_cp", "--world_size=1048576", "--max_token_len=1000"]
        code, out, err = run(huge + ["--max_cp=1", "--divisible_by=1000"], "1000\n")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--divisible_by = 1000", err)
        self.assertIn("world_size / max_cp = 1048576 / 1", err)
        # Few groups but 2^20 ranks in each of 128 slots.
        code, out, err = run(huge + ["--divisible_by=128"], "1000\n")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("2^26 rank-slots", err)
        # Every size from 1 to 2^20.
        code, out, err = run(huge + ["--cp_sizes=any"], "1000\n")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--min_cp = 1: to max_cp = 1048576 allows more than 4096 CP sizes", err)


class Errors(unittest.TestCase):
    def assert_fails(self, args, stdin, *needles):
        code, out, err = run(args, stdin)
        self.assertNotEqual(code, 0)
        self.assertEqual(out, "", "stdout must stay clean on error")
        for needle in needles:
            self.assertIn(needle, err)
        return code

    def test_bad_length_names_line_and_value(self):
        self.assert_fails(["plan", "--max_token_len=100"], "5\n7\nabc\n", "stdin:3", "'abc'")
        self.assert_fails(["plan", "--max_token_len=100"], "[5, 0]", "index 1", "length 0")

    def test_empty_input(self):
        self.assert_fails(["plan", "--max_token_len=100"], "", "no lengths")

    def test_missing_cap_is_a_usage_error(self):
        code = self.assert_fails(["plan"], "5\n", "--max_token_len")
        self.assertEqual(code, 2)

    def test_unknown_or_missing_command(self):
        self.assertEqual(self.assert_fails(["frob", "--max_token_len=9"], "5\n", "frob"), 2)
        self.assertEqual(self.assert_fails([], "5\n", "plan"), 2)

    def test_overlong_under_reject_names_the_sequence(self):
        self.assert_fails(["plan", "--max_token_len=10"], "5\n20\n", "sequence 1", "20")

    def test_bad_flag_values(self):
        self.assert_fails(["plan", "--max_token_len=10", "--algorithm=xx"], "5\n", "xx")
        self.assert_fails(["plan", "--max_token_len=10", "--format=yaml"], "5\n", "yaml")
        self.assert_fails(["plan", "--num_parts=2", "--equal_size"], "1\n2\n3\n", "equal")
        self.assert_fails(
            ["plan", "--lengths=/nonexistent", "--max_token_len=10"], "", "/nonexistent"
        )

    def test_model_config_reals(self):
        # Whole numbers written as reals are integers (4096.0 is no missing hidden_size); another
        # real where an integer is read is refused, naming the field.
        config = {
            "hidden_size": 4096.0,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8.0,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "rms_norm_eps": 1e-05,
        }
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(config, f)
            args = ["plan", "--max_token_len=100", "--world_size=2", f"--model_config={path}"]
            code, out, err = run(args, "5\n7\n9\n")
            self.assertEqual(code, 0, err)
            with open(path, "w") as f:
                json.dump(dict(config, num_key_value_heads=7.5), f)
            self.assert_fails(args, "5\n7\n9\n", "num_key_value_heads = 7.5")
            with open(path, "w") as f:
                json.dump(dict(config, num_key_value_heads=64), f)
            self.assert_fails(args, "5\n7\n9\n", "num_key_value_heads = 64")

    def test_help_goes_to_stdout_and_succeeds(self):
        code, out, err = run(["plan", "--help"])
        self.assertEqual(code, 0)
        for flag in (
            "--max_token_len",
            "--num_parts",
            "--algorithm",
            "--format",
            "--lengths",
            "--length_field",
            "--token_field",
            "--progress",
        ):
            self.assertIn(flag, out)


if __name__ == "__main__":
    PACKSCHED, GEN_LENGTHS = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1])
