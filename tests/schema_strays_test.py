#!/usr/bin/env python3
"""Fails when a conversion layer spells a schema field name by hand (one options schema).

The plan / options schema is declared once, in server/planner/schema.h (X-macro tables). The
layers that convert it — CLI flags and JSON, the sidecar's proto conversion, the C++ client's
request building and wire decoder, the pybind module and the Python package — read the names
from the table (token pasting in C++, packsched._planner.schema() in Python). This test greps
those layers for the table's names and fails on any hit not in ALLOWED below, and when an ALLOWED
entry's count of hits changes (so the list stays exact and small).

Names checked: every name the tables declare (proto field names, the loss options' Python
keywords, the Weight pair's key) that
  - contains an underscore: single words (cost, total, order, empty, indices, ...) are ordinary
    words of any code, and
  - is not also a field of a proto message outside the tables (PlanRequest, PartitionRequest,
    BalanceBatchRequest/Response, RankPlan, GetStatus...: loss_tokens, world_size,
    num_micro_batches, over_cap_parts, ...), which the conversion layers address by hand.

What counts as a hit:
  C++     the name in a string literal (JSON and dict keys, flag names, fields named in
          messages; #include paths aside), as a proto accessor (name(), set_name(),
          mutable_name(), has_name(), add_name(), clear_name(), name_size()) or as a flag
          (FLAGS_name). A planner value type's member (`o.max_token_len`, `stats.local_k`) is
          the planner's own spelling, used where code needs that one field's meaning (a CLI
          rule, a limit), and is not a hit. Comments are prose.
  Python  the name anywhere in code (names, attributes, keywords, strings); comments and
          docstrings are prose.

Tables checked: the options, the plan and micro-batch fields, and the tree's (Forest,
TreeLayout, TreePlan and TreeEntries, the last never on the wire).

Files checked (CHECKED below):
  server/cli/                 `packsched plan`: flags, parsing, JSON, table output, --tree reader
  server/service/convert.*    the sidecar's proto <-> planner conversion, and what reads the
  server/service/{options_hash,request_memory,partition,balance_batch}.cc  options beside it
  server/service/forest_convert.*  the sidecar's forest and tree plan conversion
  client/cpp/ (.cc, plan_decoder.h)  the C++ client's request building and wire decoder
  client/python/src/planner_{module,schema}.cc, plan_columns.cc  pybind dicts and numpy columns
                              <-> planner value types; the schema
  client/python/packsched/{_options,client,plan,planner}.py  option defaults and checks, proto
                              <-> Python, the pybind dicts -> Plan
Not checked, on purpose: the declarations of value types, which are where the names live
(server/planner/*, server/service/round_types.h — e.g. the round record's GlobalCounts with
its sequences_with_loss member — client/cpp/scheduler_client.h's request and result structs),
the round coordinator and the collective (they move those value types, not the schema),
packsched/compat (drop-ins that mirror verl's and OpenRLHF's own signatures, e.g. verl's
same_micro_num_in_dp), packsched/tree.py (the Forest, TreeMicroBatch and TreePlan value types and
the forest algorithms over their arrays; it reads the tree tables where it converts the
binding's dicts), packsched/kernels.py, examples, tests, docs.
"""
import io
import pathlib
import re
import sys
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "server/planner/schema.h"
PROTO = ROOT / "proto/packsched/v1/scheduler.proto"

# proto message -> the schema table(s) declaring its fields
TABLES = {
    "PlanOptions": ("PLAN_OPTIONS", "ROUND_OPTIONS"),
    "LossOptions": ("LOSS_OPTIONS",),
    "MicroBatch": ("MICRO_BATCH",),
    "PlanStats": ("PLAN_STATS",),
    "GlobalCounts": ("GLOBAL_COUNTS",),
    "PlanResponse": ("PLAN_RESPONSE",),
    "Forest": ("FOREST",),
    "TreeLayout": ("TREE_LAYOUT",),
    "TreePlan": ("TREE_PLAN",),
    # planner::TreeEntries: derived from a TreeLayout, never on the wire (no proto message)
    "TreeEntries": ("TREE_ENTRIES",),
    "DynamicCpOptions": ("DYNAMIC_CP_OPTIONS",),
}

# Messages outside the tables whose fields do not exempt a name: a dynamic-CP rank's slot reuses
# MicroBatch's vocabulary (cu_seqlens, loss_weights) for its own fields.
NOT_EXEMPTING = {"CpRankSlot"}

CHECKED = [
    "server/cli",
    "server/service/convert.cc",
    "server/service/convert.h",
    "server/service/options_hash.cc",
    "server/service/request_memory.cc",
    "server/service/partition.cc",
    "server/service/balance_batch.cc",
    "server/service/forest_convert.cc",
    "server/service/forest_convert.h",
    "client/cpp/plan_decoder.cc",
    "client/cpp/plan_decoder.h",
    "client/cpp/scheduler_client.cc",
    "client/python/src/planner_module.cc",
    "client/python/src/plan_columns.cc",
    "client/python/src/planner_schema.cc",
    "client/python/packsched/_options.py",
    "client/python/packsched/client.py",
    "client/python/packsched/plan.py",
    "client/python/packsched/planner.py",
]

# (file, name) -> (occurrences, why the name is spelled there): public API names that are the
# Python package's own (its signatures, its Plan and Bound types), not the schema's.
ALLOWED = {
    ("client/python/packsched/client.py", "max_token_len"): (
        7,
        "SchedulerClient's public signatures: the cap is the positional max_token_len",
    ),
    ("client/python/packsched/planner.py", "max_token_len"): (
        13,
        "packsched.planner's public signatures: the cap is the positional max_token_len",
    ),
    ("client/python/packsched/plan.py", "micro_batches"): (
        9,
        "a field of the public Plan type (lists of indices, not the proto's messages)",
    ),
    ("client/python/packsched/plan.py", "local_num_micro_batches"): (
        3,
        "a field of the public Plan type",
    ),
    ("client/python/packsched/plan.py", "loss_weights"): (3, "a field of the public Plan type"),
    ("client/python/packsched/plan.py", "local_k"): (
        6,
        "Plan.from_raw's and Plan.from_columns' keyword (public classmethods)",
    ),
    ("client/python/packsched/client.py", "micro_batches"): (1, "the public Plan type's keyword"),
    ("client/python/packsched/client.py", "local_num_micro_batches"): (
        1,
        "the public Plan type's keyword",
    ),
    ("client/python/packsched/client.py", "loss_weights"): (1, "the public Plan type's keyword"),
    # packsched.planner.Bound (the in-process planner's bound before agreement: Problem's
    # accessors, no proto message) and the dict local_bound() fills it from.
    ("client/python/packsched/planner.py", "lower_bound_k"): (1, "a field of Bound"),
    ("client/python/packsched/planner.py", "num_sequences"): (1, "a field of Bound"),
    ("client/python/packsched/planner.py", "num_kept"): (1, "a field of Bound"),
    ("client/python/packsched/planner.py", "total_tokens"): (1, "a field of Bound"),
    ("client/python/src/planner_module.cc", "local_k"): (1, "Problem::local_k(), for Bound"),
    ("client/python/src/planner_module.cc", "lower_bound_k"): (2, "Bound's key; Problem's"),
    ("client/python/src/planner_module.cc", "num_sequences"): (3, "Bound's key; Problem's"),
    ("client/python/src/planner_module.cc", "num_kept"): (2, "Bound's key; Problem's"),
    ("client/python/src/planner_module.cc", "total_tokens"): (2, "Bound's key; Problem's"),
    ("client/python/src/planner_module.cc", "cu_seqlens"): (
        2,
        "tree_rows' keyword and its error: the micro-batch arrays the tree layout is checked on",
    ),
    ("client/python/src/planner_module.cc", "cu_seqlens_aligned"): (
        4,
        "tree_entries', tree_rollout_rows' and tree_rows' keywords and tree_rows' error (the tree "
        "layout's input)",
    ),
    ("client/python/src/planner_module.cc", "aligned_tokens"): (
        2,
        "tree_rows' keyword and its error (the tree layout's input)",
    ),
    ("server/cli/dynamic_cp_command.cc", "cu_seqlens"): (
        1,
        "a dynamic-CP group's offsets (planner::CpGroupPlan, packsched.dynamic_cp's key), not a "
        "MicroBatch's",
    ),
    ("client/python/packsched/client.py", "max_tokens_per_rank"): (
        4,
        "SchedulerClient.plan_dynamic_cp's public signature: the cap is its positional argument",
    ),
    ("client/cpp/scheduler_client.cc", "cu_seqlens"): (
        2,
        "CpRankSlot's own field (a dynamic-CP rank's slot), read into the client's CpRankSlot",
    ),
    ("client/cpp/scheduler_client.cc", "loss_weights"): (
        2,
        "CpRankSlot's own field (a dynamic-CP rank's slot), read into the client's CpRankSlot",
    ),
    ("client/python/src/planner_module.cc", "piece_rollout_begin"): (
        1,
        "ToLayout's error: the layout array it checks (the binding's own check of its input)",
    ),
    ("client/python/src/planner_module.cc", "piece_rollouts"): (
        2,
        "ToLayout's errors: the layout arrays they check (the binding's own check of its input)",
    ),
    ("server/service/request_memory.cc", "node_len"): (
        2,
        "EntriesOf walks the forest's trees for the estimate (the lengths, parents and leaves)",
    ),
    ("server/service/request_memory.cc", "node_parent"): (
        2,
        "EntriesOf walks the forest's trees for the estimate (the lengths, parents and leaves)",
    ),
    ("server/service/request_memory.cc", "rollout_leaf"): (
        1,
        "EntriesOf walks the forest's trees for the estimate (the lengths, parents and leaves)",
    ),
    ("client/python/packsched/planner.py", "rollout_part"): (
        1,
        "a field of the public TreePlan type (packsched.tree): a rank's rollouts",
    ),
    ("client/python/packsched/plan.py", "forwarded_tokens"): (
        1,
        "Plan.tokens: the forwarded count of TokenAccounting",
    ),
    ("client/python/packsched/plan.py", "total_tokens"): (
        1,
        "Plan.tokens: the logical count of TokenAccounting",
    ),
    ("client/python/packsched/plan.py", "packed_tokens"): (
        1,
        "Plan.tokens: the executed count of TokenAccounting",
    ),
}


def table_names():
    """Every name the schema tables declare: {name: table}."""
    text = SCHEMA.read_text()
    names = {}
    for table in sorted({t for ts in TABLES.values() for t in ts}):
        match = re.search(rf"#define PACKSCHED_{table}\(X\)(.*?)(?:\n\n|\n//)", text, re.S)
        assert match, f"no table PACKSCHED_{table} in {SCHEMA}"
        for row in re.finditer(r"X\((\w+)(?:,([^)]*))?\)", match.group(1)):
            names[row.group(1)] = table
            if table == "LOSS_OPTIONS":  # the Python keyword (last column)
                names[row.group(2).split(",")[-1].strip()] = table
    pair = re.search(r"#define PACKSCHED_WEIGHT_PAIR (\w+)", text)
    names[pair.group(1)] = "WEIGHT_PAIR"
    return names


def other_proto_fields():
    """Field names of the proto messages that are not schema tables."""
    fields = set()
    for message in re.finditer(r"^message (\w+) \{(.*?)^\}", PROTO.read_text(), re.S | re.M):
        if message.group(1) in TABLES or message.group(1) in NOT_EXEMPTING:
            continue
        body = re.sub(r"//[^\n]*", "", message.group(2))
        fields |= set(re.findall(r"(\w+)\s*=\s*\d+\s*;", body))
    return fields


def checked_names():
    return {name for name in table_names() if "_" in name} - other_proto_fields()


def cpp_parts(text):
    """(code, strings) of C++ source: comments dropped, string literals apart."""
    code, strings = [], []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < len(text) and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            strings.append(text[i + 1 : j])
            code.append(" " * (j + 1 - i))
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = len(text) if j < 0 else j + 2
        else:
            code.append(c)
            if c == "\n":
                strings.append("\n")
            i += 1
    return "".join(code), " ".join(strings)


def cpp_hits(text, names):
    """Where C++ spells a schema name by hand: in a string literal (a JSON or dict key, a flag or
    field named in a message), a proto accessor (name(), set_name(), mutable_name(), has_name(),
    add_name(), clear_name(), name_size()) or a flag (FLAGS_name). A planner value type's member
    (`o.max_token_len`) is the planner's spelling, read where a conversion needs that one field's
    meaning, and is not a hit."""
    alternatives = "|".join(sorted(names, key=len, reverse=True))
    accessor = re.compile(
        rf"(?:\b(?:set_|mutable_|has_|add_|clear_)|\bFLAGS_|\b)({alternatives})(?:\s*\(|_size\b)"
    )
    flag = re.compile(rf"\bFLAGS_({alternatives})\b")
    word = re.compile(rf"\b({alternatives})\b")
    text = re.sub(r"(?m)^\s*#\s*include.*$", "", text)  # header paths are not names
    code, strings = cpp_parts(text)
    hits = []
    for number, line in enumerate(code.splitlines(), 1):
        hits += [(number, m.group(1), line) for m in accessor.finditer(line)]
        hits += [(number, m.group(1), line) for m in flag.finditer(line)]
    for number, line in enumerate(strings.split("\n"), 1):
        hits += [(number, m.group(1), f'"{line.strip()}"') for m in word.finditer(line)]
    return hits


def python_code(text):
    """Python without comments and docstrings, one line of code per source line."""
    lines = text.splitlines()
    drop = []  # (start, end) of docstrings and comments
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            drop.append((token.start, token.end))
        elif token.type == tokenize.STRING and previous in (
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.NL,
        ):
            drop.append((token.start, token.end))  # an expression statement: a docstring
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    for (row, col), (end_row, end_col) in reversed(drop):
        if row == end_row:
            line = lines[row - 1]
            lines[row - 1] = line[:col] + " " * (end_col - col) + line[end_col:]
        else:
            lines[row - 1] = lines[row - 1][:col]
            for r in range(row, end_row - 1):
                lines[r] = ""
            lines[end_row - 1] = " " * end_col + lines[end_row - 1][end_col:]
    return "\n".join(lines)


def files():
    for entry in CHECKED:
        path = ROOT / entry
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".h", ".cc"))
        else:
            yield path


def python_hits(text, names):
    """Where Python spells a schema name by hand: any code token (a name, an attribute, a keyword,
    a string); comments and docstrings are prose."""
    word = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    return [
        (number, m.group(1), line)
        for number, line in enumerate(python_code(text).splitlines(), 1)
        for m in word.finditer(line)
    ]


def strays():
    names = checked_names()
    found, counts = [], {}
    for path in files():
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        hits = python_hits(text, names) if path.suffix == ".py" else cpp_hits(text, names)
        for number, name, line in hits:
            key = (rel, name)
            if key in ALLOWED:
                counts[key] = counts.get(key, 0) + 1
            else:
                found.append(f"{rel}:{number}: {name}: {line.strip()}")
    wrong = [
        f"{rel}: {name}: allowed {allowed}, found {counts.get((rel, name), 0)}"
        for (rel, name), (allowed, _) in sorted(ALLOWED.items())
        if counts.get((rel, name), 0) != allowed
    ]
    return found, wrong


def main():
    found, wrong = strays()
    for line in found:
        print(f"stray schema name (read it from server/planner/schema.h): {line}")
    for line in wrong:
        print(f"ALLOWED count differs (update the entry): {line}")
    if found or wrong:
        return 1
    print(
        f"no stray schema names in {len(list(files()))} files "
        f"({len(checked_names())} names checked, {len(ALLOWED)} allowed spellings)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
