"""The schema table (server/planner/schema.h, via packsched._planner.schema()) against the proto.

Every field of the schema's proto messages is in its table with the same number and a matching
type, and every table row is in the proto: a field added to one and not the other fails here.
The Python package's option defaults, choices and dataclasses are checked to come from it.
"""

import dataclasses

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from packsched import _options, _planner, plan, tree
from packsched.v1 import scheduler_pb2

SCHEMA = _planner.schema()

INT64 = (F.TYPE_INT64,)
# (proto message, schema rows, expected proto type per rule/kind: (types, repeated, presence))
EXPECTED = {
    "PlanOptions": {
        "Cap": (INT64, False, False),
        "Unlimited": (INT64, False, False),
        "Count": (INT64, False, False),
        "Align": (INT64, False, False),
        "Ceiling": (INT64, False, False),
        "Enum": ((F.TYPE_ENUM,), False, False),
        "Weight": (INT64, False, True),
        "FixedK": ((F.TYPE_BOOL,), False, False),
        "Round": ((F.TYPE_BOOL,), False, True),
    },
    "LossOptions": {
        "Enum": ((F.TYPE_ENUM,), False, False),
        "SumNorm": ((F.TYPE_DOUBLE,), False, False),
    },
    "MicroBatch": {
        "Int": (INT64, False, False),
        "Bool": ((F.TYPE_BOOL,), False, False),
        "Ints": ((F.TYPE_INT64, F.TYPE_INT32), True, False),
        "LossScale": ((F.TYPE_DOUBLE,), False, True),
    },
    "PlanStats": {
        "Int": (INT64, False, False),
        "Double": ((F.TYPE_DOUBLE,), False, False),
        "Cap": (INT64, False, False),
        "Micros": (INT64, False, False),
    },
    "GlobalCounts": {
        "Kept": (INT64, False, False),
        "Loss": (INT64, False, False),
        "World": (INT64, False, False),
    },
    "DynamicCpOptions": {
        "Cap": (INT64, False, False),
        "Int": (INT64, False, False),
        "MaxCp": (INT64, False, False),
        "Nodes": (INT64, False, False),
        "Enum": ((F.TYPE_ENUM,), False, False),
        "Weight": (INT64, False, True),
        "Ratio": ((F.TYPE_DOUBLE,), False, True),
        "Bytes": (INT64, False, False),
    },
    "PlanResponse": {
        "Count": (INT64, False, False),
        "LocalK": (INT64, False, False),
        "Parts": ((F.TYPE_MESSAGE,), True, False),
        "Indices": (INT64, True, False),
        "Weights": ((F.TYPE_DOUBLE,), True, False),
        "Global": ((F.TYPE_MESSAGE,), False, False),
        "Stats": ((F.TYPE_MESSAGE,), False, False),
        "Tree": ((F.TYPE_MESSAGE,), False, False),
    },
    "Forest": {
        "Nodes": (INT64, True, False),
        "Rollouts": (INT64, True, False),
        "Checked": (INT64, True, False),
    },
    "TreeLayout": {
        "Ints": (INT64, True, False),
    },
    "TreePlan": {
        "Layouts": ((F.TYPE_MESSAGE,), True, False),
        "Ints": (INT64, True, False),
        "Int": (INT64, False, False),
    },
}


def rows(message):
    """The schema rows of a proto message: dicts with name, number and rule (or kind)."""
    if message == "PlanOptions":
        return SCHEMA["plan_options"] + SCHEMA["round_options"]
    table = {
        "LossOptions": "loss_options",
        "MicroBatch": "micro_batch",
        "PlanStats": "plan_stats",
        "GlobalCounts": "global_counts",
        "PlanResponse": "plan_response",
        "Forest": "forest",
        "TreeLayout": "tree_layout",
        "TreePlan": "tree_plan",
        "DynamicCpOptions": "dynamic_cp_options",
    }[message]
    # PlanStats' LocalK row is the planner's only (number 0): on the wire it is the response's.
    return [r for r in SCHEMA[table] if r["number"] != 0]


@pytest.mark.parametrize("message", sorted(EXPECTED))
def test_table_and_proto_have_the_same_fields(message):
    descriptor = scheduler_pb2.DESCRIPTOR.message_types_by_name[message]
    proto = {f.name: f.number for f in descriptor.fields}
    table = {r["name"]: r["number"] for r in rows(message)}
    assert table == proto, (
        f"{message}: only in the proto {sorted(set(proto) - set(table))}, only in "
        f"server/planner/schema.h {sorted(set(table) - set(proto))}, or a number differs"
    )


def _is_repeated(field):
    """protobuf >= 6 has ``is_repeated`` (and dropped ``label`` in its upb runtime); older ones
    only ``label``."""
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == F.LABEL_REPEATED


@pytest.mark.parametrize("message", sorted(EXPECTED))
def test_table_rules_match_the_proto_types(message):
    descriptor = scheduler_pb2.DESCRIPTOR.message_types_by_name[message]
    for r in rows(message):
        rule = r.get("rule") or r.get("kind")
        types, repeated, presence = EXPECTED[message][rule]
        field = descriptor.fields_by_name[r["name"]]
        assert field.type in types, (message, r["name"], rule, field.type)
        assert _is_repeated(field) == repeated, (message, r["name"])
        assert field.has_presence == presence or field.type == F.TYPE_MESSAGE, (
            message,
            r["name"],
            "proto3 optional" if presence else "no presence",
        )


def test_enum_choices_are_the_proto_values_in_order():
    """The proto value of an enum option's name is its planner index + 1 (0 = the default), as the
    sidecar's conversion and both clients assume; the planner may know more (dataset packers)."""
    for message, table in (("PlanOptions", "plan_options"), ("LossOptions", "loss_options")):
        descriptor = scheduler_pb2.DESCRIPTOR.message_types_by_name[message]
        for r in SCHEMA[table]:
            if r["rule"] != "Enum":
                continue
            enum = descriptor.fields_by_name[r["name"]].enum_type
            assert enum.name == r["type"]
            prefix = enum.values_by_number[0].name[: -len("UNSPECIFIED")]
            for value in enum.values:
                if value.number > 0:
                    assert r["choices"][value.number - 1] == value.name[len(prefix) :].lower()
            assert r["default"] == r["choices"][0]


def test_dynamic_cp_sizes_are_the_proto_values_in_order():
    """CpSizeRule on the wire is the planner's value + 1, as the sidecar and the C++ client
    convert it; the planner's names are the CLI's and packsched.dynamic_cp's."""
    from packsched.dynamic_cp import SIZES

    [row] = [r for r in SCHEMA["dynamic_cp_options"] if r["rule"] == "Enum"]
    field = scheduler_pb2.DynamicCpOptions.DESCRIPTOR.fields_by_name[row["name"]]
    assert field.enum_type.name == row["type"]
    names = [v.name for v in field.enum_type.values if v.number > 0]
    assert names == ["CP_SIZE_RULE_" + s.upper() for s in SIZES]


def test_json_positions_are_a_permutation():
    positions = {}
    for r in SCHEMA["plan_options"]:
        positions.setdefault(r["json"], set()).add(r["rule"])
    assert sorted(positions) == list(range(len(positions)))
    assert all(len(rules) == 1 for rules in positions.values())  # only the Weight pair shares


def test_python_options_come_from_the_table():
    names = {r["name"] for r in SCHEMA["plan_options"] if r["rule"] != "Weight"}
    names |= {r["name"] for r in SCHEMA["round_options"]} | {SCHEMA["weight_pair"]}
    assert set(_options.PLAN_DEFAULTS) == names
    assert set(_options.LOSS_DEFAULTS) == {r["key"] for r in SCHEMA["loss_options"]} | {
        "loss_tokens"
    }
    for r in SCHEMA["plan_options"] + SCHEMA["loss_options"]:
        if r["rule"] == "Enum":
            assert _options.CHOICES[r.get("key", r["name"])] == tuple(r["choices"])


def test_plan_dataclasses_have_the_table_fields():
    assert [f.name for f in dataclasses.fields(plan.MicroBatchMeta)] == [
        r["name"] for r in SCHEMA["micro_batch"]
    ]
    stats = [f.name for f in dataclasses.fields(plan.PlanStats)]
    planner = [r["name"] for r in SCHEMA["plan_stats"] if r["kind"] in ("Int", "Double", "LocalK")]
    assert stats[: len(planner)] == planner
    assert len(stats) == len(SCHEMA["plan_stats"])


def test_tree_entries_are_not_on_the_wire():
    """The entries are derived from a layout and the forest (the layout's fields that carried
    them are reserved): none is a field of the tree's messages."""
    wire = {
        f.name
        for message in ("TreeLayout", "TreePlan")
        for f in scheduler_pb2.DESCRIPTOR.message_types_by_name[message].fields
    }
    assert SCHEMA["tree_entries"] and not set(SCHEMA["tree_entries"]) & wire


def test_tree_types_hold_the_tree_tables():
    """packsched.tree's Forest, TreeMicroBatch and TreePlan have a field per row of the forest,
    tree layout and tree plan tables (the layouts: TreePlan.micro_batches)."""
    holders = (
        (tree.Forest, "forest", ()),
        (tree.TreeMicroBatch, "tree_layout", ()),
        (tree.TreePlan, "tree_plan", ("Layouts",)),
    )
    for cls, table, elsewhere in holders:
        names = {f.name for f in dataclasses.fields(cls)}
        rows = [r["name"] for r in SCHEMA[table] if r["kind"] not in elsewhere]
        assert rows and set(rows) <= names, (cls.__name__, sorted(set(rows) - names))
