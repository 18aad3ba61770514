#ifndef PACKSCHED_SERVER_PLANNER_SCHEMA_H_
#define PACKSCHED_SERVER_PLANNER_SCHEMA_H_

#include "absl/strings/string_view.h"

// The one declaration of the plan / options schema: every field of the planner's options, of a
// forest of rollouts and of a plan (a tree plan's too) that crosses a boundary — the `packsched
// plan` flags and JSON (its --tree reader), the sidecar's proto conversion
// (server/service/convert.cc and forest_convert.cc, with options_hash.cc, partition.cc,
// balance_batch.cc and request_memory.cc beside them), the C++ client's request building and
// wire decoder (client/cpp), and the Python package (the pybind dicts and keywords of
// client/python/src and, through packsched._planner.schema(), packsched/_options.py, client.py,
// plan.py, planner.py and tree.py).
//
// Each table is an X-macro: PACKSCHED_<TABLE>(X) calls X once per field, in proto field order.
// Consumers define X to expand the columns into straight-line code (token pasting gives the
// proto accessors `p.name()` / `set_name()`, the flag `FLAGS_name`, the planner member
// `o.member`; `#name` gives the JSON key, the Python keyword and the error messages), so the
// compiled code is what a hand-written conversion would be: no maps, no loops over names.
// The Rule / Kind column says how a field is converted; each consumer has one macro per rule
// it acts on (PACKSCHED_<CONSUMER>_<Rule>), so a field of an existing rule needs no consumer
// change, and none for the rules it does not act on (PACKSCHED_SCHEMA_ONLY / EXCEPT below: its X
// macro names the rules it acts on, or those it skips), so a new rule changes no consumer that
// has nothing to do with it. A rule
// macro takes what it touches as arguments (the message, the value type, ...); the X macro a
// consumer hands the table binds them, and each consumer's block opens with one row written out
// as its expansion produces it (leaving out the parentheses a rule puts around its arguments,
// `(o).member`, for clang-tidy's bugprone-macro-parentheses). A single field named in a message
// or a key uses the constexpr lookups at the end (OptionNamed, ResponseNamed) rather than an
// expansion of the whole table.
//
// Adding a field: the proto message, the planner (value type and its default), and a row here.
// tests/python/test_schema.py fails when a table and the proto disagree (a field missing on
// either side, a different number); tests/schema_strays_test.py fails when a conversion layer
// spells a table name by hand instead of reading it from here.
//
// Preprocessor tables and a few constexpr lookups (absl only): usable from every layer, the
// planner's layering rule holds (no proto, no gRPC). Names are the proto's; `member` is the
// planner's where it differs (attention.linear).

// packsched.v1.PlanOptions, the planner's part (planner::PlanOptions).
//   X(name, number, Rule, Type, member, json, help)
//   Rule      Cap        the cap: 0 = no cap (fixed k only), else [1, kMaxLength]
//             Unlimited  >= 0, 0 = unlimited (Python: None)
//             Count      0 = 1 on the wire; at most the Ceiling field (micro-batch counts)
//             Align      0 = 1 on the wire; at most kMaxAlign
//             Enum       Type is the enum's name in the planner and in the proto (proto value =
//                        planner value + 1; 0 = the planner's default)
//             Weight     proto3 optional, unset = the planner's default; [0, kMaxAttentionWeight];
//                        the CLI, JSON and Python carry the Weight fields as one pair,
//                        PACKSCHED_WEIGHT_PAIR ("A,B" / [A, B] / (a, b)), in table order
//             Ceiling    the micro-batch count limit: 0 on the wire = the server's limit; the
//                        C++ and Python clients send 0 for the planner's default
//             FixedK     bool, fixed-k (Partition) only
//   Type      int64, bool, or the enum type (CapMode, ...)
//   json      position in the "options" object of `packsched plan --format=json` (the order of
//             its first release; a new option takes the next number). The Weight fields share
//             one (their pair); the CLI's own --num_parts follows the Cap field.
//   help      the `packsched plan` flag's help text ("" = no flag of its own: Weight)
#define PACKSCHED_PLAN_OPTIONS(X)                                                                \
  X(max_token_len, 1, Cap, int64, max_token_len, 1,                                              \
    "cap per micro-batch in tokens (see --cap_mode); required unless --num_parts is set")        \
  X(cap_mode, 2, Enum, CapMode, cap_mode, 3,                                                     \
    "tokens (sum of aligned lengths) | padded (sequences x longest aligned length)")             \
  X(max_seqs_per_micro_batch, 3, Unlimited, int64, max_seqs_per_micro_batch, 4,                  \
    "most sequences in one micro-batch; 0 = no limit")                                           \
  X(min_micro_batches, 4, Count, int64, min_micro_batches, 5,                                    \
    "the plan has at least this many micro-batches")                                             \
  X(divisible_by, 5, Count, int64, divisible_by, 6,                                              \
    "the micro-batch count is a multiple of this (pipeline parallelism)")                        \
  X(align_to, 6, Align, int64, align_to, 7,                                                      \
    "each sequence is padded to a multiple of this (e.g. 2*tp*cp)")                              \
  X(align_total_to, 7, Align, int64, align_total_to, 8,                                          \
    "each micro-batch's total is padded to a multiple of this (e.g. Ulysses SP)")                \
  X(algorithm, 8, Enum, Algorithm, algorithm, 0,                                                 \
    "kk | lpt (balanced micro-batches), ffd | bfd | sequential (dataset packing: as many "       \
    "bins as needed)")                                                                           \
  X(cost, 9, Enum, CostModel, cost, 9,                                                           \
    "what balancing equalises: tokens | attention (a*L + b*L^2, see --attention_cost)")          \
  X(attention_linear, 10, Weight, int64, attention.linear, 10, "")                               \
  X(attention_quadratic, 11, Weight, int64, attention.quadratic, 10, "")                         \
  X(overlong, 12, Enum, OverlongPolicy, overlong, 11,                                            \
    "a sequence longer than the cap: reject (error) | isolate (own micro-batch) | drop")         \
  X(order, 13, Enum, PartOrder, order, 12,                                                       \
    "micro-batch order: cost_desc | index | interleave (large in the middle)")                   \
  X(max_micro_batches, 14, Ceiling, int64, max_micro_batches, 13,                                \
    "fail if the plan needs more micro-batches than this")                                       \
  X(equal_size, 15, FixedK, bool, equal_size, 2,                                                 \
    "with --num_parts: every micro-batch gets n / K sequences (the cap is not guaranteed)")      \
  X(context_parallel, 18, Align, int64, context_parallel, 14,                                    \
    "context-parallel ranks per micro-batch (the cap stays per CP group); align_to defaults to " \
    "2*cp*tp and the attention cost is divided over the CP ranks")                               \
  X(tensor_parallel, 19, Align, int64, tensor_parallel, 15,                                      \
    "tensor-parallel ranks (sequence parallelism): align_to defaults to tp, or 2*cp*tp with CP")

// packsched.v1.PlanOptions, the round's part (not planner options: the sidecar's round and the
// clients' PlanRequest hold them under the same name). Sidecar rounds only: no flag, no JSON.
//   X(name, number, default)   proto3 optional bool; unset = default
#define PACKSCHED_ROUND_OPTIONS(X) X(same_micro_num_in_dp, 16, true)

// The CLI flag / JSON key / Python keyword of the Weight fields taken together (an identifier,
// and as a string).
#define PACKSCHED_WEIGHT_PAIR attention_cost
#define PACKSCHED_SCHEMA_STR_(x) #x
#define PACKSCHED_SCHEMA_STR(x) PACKSCHED_SCHEMA_STR_(x)
#define PACKSCHED_WEIGHT_PAIR_KEY PACKSCHED_SCHEMA_STR(PACKSCHED_WEIGHT_PAIR)

// packsched.v1.LossOptions (planner::LossOptions).
//   X(name, number, Rule, Type, member, key)
//   Rule  Enum (as above) | SumNorm (a double, finite and > 0 when the mode is sum_norm)
//   key   the Python keyword (loss_mode: `mode` alone would be ambiguous among the options)
#define PACKSCHED_LOSS_OPTIONS(X)                                   \
  X(mode, 1, Enum, LossMode, mode, loss_mode)                       \
  X(dp_reduction, 2, Enum, DpReduction, dp_reduction, dp_reduction) \
  X(sum_norm_constant, 3, SumNorm, double, sum_norm_constant, sum_norm_constant)

// packsched.v1.MicroBatch (planner::MicroBatch; the JSON and pybind dicts list them in this
// order).
//   X(name, number, Kind)
//   Kind  Int (int64) | Ints (repeated int64 / int32, a std::vector) | Bool |
//         LossScale (optional double, not a planner field: the loss weights' per-part scale)
#define PACKSCHED_MICRO_BATCH(X)  \
  X(indices, 1, Ints)             \
  X(tokens, 2, Int)               \
  X(aligned_tokens, 3, Int)       \
  X(total, 4, Int)                \
  X(padded_tokens, 5, Int)        \
  X(cost, 6, Int)                 \
  X(max_seqlen, 7, Int)           \
  X(max_seqlen_aligned, 8, Int)   \
  X(cu_seqlens, 9, Ints)          \
  X(cu_seqlens_aligned, 10, Ints) \
  X(empty, 11, Bool)              \
  X(overlong, 12, Bool)           \
  X(loss_scale, 13, LossScale)    \
  X(filler, 14, Bool)

// packsched.v1.PlanStats and planner::PlanStats (their union, in proto order).
//   X(name, number, Kind, alias)
//   Kind   Int | Double: planner::PlanStats members on the wire under the same name
//          LocalK: planner::PlanStats only (number 0); on the wire it is the response's
//                  local_num_micro_batches
//          Cap:    wire only, the cap applied; Python PlanStats calls it `alias`
//          Micros: wire only, a duration in microseconds; `alias` is the stem of the C++
//                  absl::Duration member (alias_time) and of the Python milliseconds (alias_ms)
//   Python's PlanStats lists the planner's fields first, then the wire-only ones.
#define PACKSCHED_PLAN_STATS(X)          \
  X(num_sequences, 1, Int, _)            \
  X(num_kept, 2, Int, _)                 \
  X(total_tokens, 3, Int, _)             \
  X(total_cost, 4, Int, _)               \
  X(max_part_cost, 5, Int, _)            \
  X(min_part_cost, 6, Int, _)            \
  X(imbalance, 7, Double, _)             \
  X(lower_bound_k, 8, Int, _)            \
  X(local_k, 0, LocalK, _)               \
  X(max_token_len, 9, Cap, cap)          \
  X(over_cap_parts, 10, Int, _)          \
  X(naive_padded_tokens, 11, Int, _)     \
  X(packed_tokens, 12, Int, _)           \
  X(local_us, 13, Micros, local)         \
  X(wait_us, 14, Micros, wait)           \
  X(partition_us, 15, Micros, partition) \
  X(forwarded_tokens, 16, Int, _)        \
  X(loss_tokens, 17, Int, _)

// packsched.v1.GlobalCounts (the sidecar's and the C++ client's GlobalCounts value types have
// these members).
//   X(name, number, Kind)
//   Kind  Kept: kept sequences over the ranks (Partition: 0 = this request's own)
//         Loss: a planner::LossCounts member, summed over the ranks (>= this rank's own)
//         World: DP ranks in the round (Partition: [0, kMaxWorldSize], 0 = 1)
#define PACKSCHED_GLOBAL_COUNTS(X) \
  X(num_sequences, 1, Kept)        \
  X(loss_tokens, 2, Loss)          \
  X(sequences_with_loss, 3, Loss)  \
  X(world_size, 4, World)

// packsched.v1.PlanResponse.
//   X(name, number, Kind)
//   Kind  Count: the agreed k | LocalK: this rank's bound (planner: PlanStats::local_k) |
//         Parts: repeated MicroBatch | Indices: a planner::MicroBatchPlan index list |
//         Weights: repeated double, per sequence | Global: GlobalCounts | Stats: PlanStats |
//         Tree: TreePlan, a forest request's layout (tree_plan.h)
#define PACKSCHED_PLAN_RESPONSE(X)      \
  X(num_micro_batches, 1, Count)        \
  X(local_num_micro_batches, 2, LocalK) \
  X(micro_batches, 3, Parts)            \
  X(reorder, 4, Indices)                \
  X(revert, 5, Indices)                 \
  X(dropped, 6, Indices)                \
  X(loss_weights, 7, Weights)           \
  X(global, 8, Global)                  \
  X(stats, 9, Stats)                    \
  X(tree, 10, Tree)

// packsched.v1.DynamicCpOptions (planner::DynamicCpOptions and planner::CpModelLinks,
// server/planner/dynamic_cp.h and dynamic_cp_model.h). The rank count R is not an option: it is
// the CLI's --world_size and a sidecar round's world size.
//   X(name, number, Rule, Type, member, flag, Owner, help)
//   Rule  Cap     the cap on one rank's rows: required, [1, kMaxLength]
//         Int     int64 >= 1 (0 on the wire = the planner's default)
//         MaxCp   int64 >= 0, 0 = R
//         Enum    Type is the enum's name (proto value = planner value + 1; 0 = the default)
//         Weight  a CpCostModel weight, int64 >= 0; proto3 optional, unset = the default; a
//                 model config replaces it
//         Nodes   CpCostModel::node_ranks, int64 >= 0 (0 = one node), with or without a model
//         Ratio   a CpModelLinks ratio (double, finite, >= 0): with a model config only
//         Bytes   CpModelLinks::bytes_per_element, >= 1: with a model config only
//   member  the planner's member: of DynamicCpOptions (Cap, Int, MaxCp, Enum, Weight) or of
//           CpModelLinks (Ratio, Bytes)
//   flag    the `packsched plan --dynamic_cp` flag that sets it
//   Owner   Own: the flag is dynamic CP's own | Plan: an int64 flag of `packsched plan` that means
//           the same here (max_token_len: the cap, now per rank)
//   help    the flag's help text ("" for a Plan flag)
#define PACKSCHED_DYNAMIC_CP_OPTIONS(X)                                                           \
  X(max_tokens_per_rank, 1, Cap, int64, max_tokens_per_rank, max_token_len, Plan, "")             \
  X(sizes, 2, Enum, CpSizeRule, sizes, cp_sizes, Own,                                             \
    "with --dynamic_cp: the CP group sizes a slot may use: powers_of_two | divisors (of "         \
    "--world_size) | any")                                                                        \
  X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "with --dynamic_cp: the smallest CP group size")  \
  X(max_cp, 4, MaxCp, int64, max_cp, max_cp, Own,                                                 \
    "with --dynamic_cp: the largest CP group size, a divisor of --world_size (0 = "               \
    "--world_size)")                                                                              \
  X(tensor_parallel, 5, Int, int64, tensor_parallel, tensor_parallel, Plan, "")                   \
  X(divisible_by, 6, Int, int64, divisible_by, divisible_by, Plan, "")                            \
  X(linear, 7, Weight, int64, cost.linear, cp_linear, Own,                                        \
    "with --dynamic_cp: cost per token (without --model_config)")                                 \
  X(quadratic, 8, Weight, int64, cost.quadratic, cp_quadratic, Own,                               \
    "with --dynamic_cp: cost per token^2 (without --model_config)")                               \
  X(comm, 9, Weight, int64, cost.comm, cp_comm, Own,                                              \
    "with --dynamic_cp: cost per token a rank receives and sends (without --model_config)")       \
  X(micro_batch_cost, 10, Weight, int64, cost.micro_batch, cp_micro_batch_cost, Own,              \
    "with --dynamic_cp: cost per non-empty micro-batch of a group (without --model_config)")      \
  X(node_ranks, 11, Nodes, int64, cost.node_ranks, cp_node_ranks, Own,                            \
    "with --dynamic_cp: ranks of a node; larger groups pay --cp_comm_across_nodes (0 = every "    \
    "group within a node)")                                                                       \
  X(comm_across_nodes, 12, Weight, int64, cost.comm_across_nodes, cp_comm_across_nodes, Own,      \
    "with --dynamic_cp: --cp_comm for groups larger than --cp_node_ranks (without "               \
    "--model_config)")                                                                            \
  X(flops_per_byte, 13, Ratio, double, flops_per_byte, cp_flops_per_byte, Own,                    \
    "with --dynamic_cp and --model_config: the device's FLOP/s over one link's bytes/s within a " \
    "node")                                                                                       \
  X(flops_per_byte_across_nodes, 14, Ratio, double, flops_per_byte_across_nodes,                  \
    cp_flops_per_byte_across_nodes, Own,                                                          \
    "with --dynamic_cp and --model_config: --cp_flops_per_byte across nodes")                     \
  X(bytes_per_element, 15, Bytes, int64, bytes_per_element, cp_bytes_per_element, Own,            \
    "with --dynamic_cp and --model_config: bytes of one key or value element")

// packsched.v1.Forest (planner::Forest, packsched.tree.Forest): a forest request's input, also
// the JSON object of `packsched plan --tree` and the binding's keywords, in this order.
//   X(name, number, Kind)
//   Kind  Nodes     repeated int64 [N], one per node: required
//         Rollouts  repeated int64 [R], one per rollout: required
//         Checked   repeated int64, empty or [R]: optional, checked against the rollouts' paths
//                   (the clients derive it and do not send it)
#define PACKSCHED_FOREST(X)    \
  X(node_len, 1, Nodes)        \
  X(node_parent, 2, Nodes)     \
  X(rollout_leaf, 3, Rollouts) \
  X(rollout_len, 4, Checked)

// packsched.v1.TreeLayout (planner::TreeLayout): one micro-batch's layout as a plan keeps it.
//   X(name, number, Kind)
//   Kind  Ints  repeated int64, the planner::TreeLayout member of the same name
#define PACKSCHED_TREE_LAYOUT(X) \
  X(rollouts, 7, Ints)           \
  X(piece_rollouts, 9, Ints)     \
  X(piece_rollout_begin, 10, Ints)

// packsched.v1.TreePlan (planner::TreePlan): a forest request's layout and figures, beside the
// plan over pieces (PACKSCHED_PLAN_RESPONSE's Tree row).
//   X(name, number, Kind)
//   Kind  Layouts  repeated TreeLayout, one per micro-batch (planner::TreePlan::parts' layout)
//         Ints     repeated int64 | Int: int64, the planner::TreePlan member of the same name
#define PACKSCHED_TREE_PLAN(X) \
  X(layouts, 1, Layouts)       \
  X(rollout_part, 2, Ints)     \
  X(forwarded_tokens, 3, Int)  \
  X(rollout_tokens, 4, Int)

// planner::TreeEntries (tree_plan.h): a micro-batch's layout node by node, derived from its
// TreeLayout and the forest, never on the wire (the JSON of `packsched plan --tree` and the
// binding's tree_entries dict list them in this order).
//   X(name)   an int64 array, the planner::TreeEntries member of the same name
#define PACKSCHED_TREE_ENTRIES(X) \
  X(nodes)                        \
  X(piece_begin)                  \
  X(row)                          \
  X(position)                     \
  X(subtree_end)                  \
  X(parent)                       \
  X(rollout_entry)

// Expands to nothing: a rule with nothing to do.
#define PACKSCHED_SCHEMA_NOTHING(...)

// A consumer's rule for a row, with a default, so that a consumer defines the rules it acts on
// and no stub for the others. A consumer's X macro names its rule macros' prefix, the row's rule /
// kind and either
//   PACKSCHED_SCHEMA_ONLY(PREFIX, Kind, K1, K2, ...)    PREFIX_Kind when Kind is one of K1, K2,
//                                                       ..., else PACKSCHED_SCHEMA_NOTHING
//   PACKSCHED_SCHEMA_EXCEPT(PREFIX, Kind, K1, K2, ...)  PACKSCHED_SCHEMA_NOTHING when Kind is one
//                                                       of K1, K2, ..., else PREFIX_Kind
// (at most 8 listed), then the rule's arguments, as convert.cc's PACKSCHED_HEAD(name, number,
// Kind) does with
//   PACKSCHED_SCHEMA_ONLY(PACKSCHED_HEAD, Kind, Count, LocalK)(response, k, plan, name)
// A consumer that acts on a few kinds (the counts of a response, its index lists) lists them with
// ONLY: a new kind does nothing there. One that converts every field lists with EXCEPT the kinds
// that are not its own, or pastes PREFIX_##Kind itself when it has a rule for each: a new kind
// without its rule there fails to compile.
#define PACKSCHED_SCHEMA_ONLY(prefix, Kind, ...) \
  PACKSCHED_SCHEMA_CAT(PACKSCHED_SCHEMA_PICK_, PACKSCHED_SCHEMA_IN(Kind, __VA_ARGS__))(prefix, Kind)
#define PACKSCHED_SCHEMA_EXCEPT(prefix, Kind, ...) \
  PACKSCHED_SCHEMA_CAT(PACKSCHED_SCHEMA_SKIP_, PACKSCHED_SCHEMA_IN(Kind, __VA_ARGS__))(prefix, Kind)

// The machinery of ONLY and EXCEPT: PACKSCHED_SCHEMA_IN(Kind, K1, ...) is 1 when Kind is one of
// K1, ... (PACKSCHED_SCHEMA_SAME_Kind_Kind, defined below for every rule and kind, is a comma:
// the third argument of PACKSCHED_SCHEMA_THIRD shifts from 0 to 1), else 0.
#define PACKSCHED_SCHEMA_CAT_(a, b) a##b
#define PACKSCHED_SCHEMA_CAT(a, b) PACKSCHED_SCHEMA_CAT_(a, b)
#define PACKSCHED_SCHEMA_THIRD_(a, b, c, ...) c
#define PACKSCHED_SCHEMA_THIRD(...) PACKSCHED_SCHEMA_THIRD_(__VA_ARGS__)
#define PACKSCHED_SCHEMA_SAME_EACH(K, a, b, c, d, e, f, g, h, ...)                                \
  PACKSCHED_SCHEMA_SAME_##K##_##a PACKSCHED_SCHEMA_SAME_##K##_##b PACKSCHED_SCHEMA_SAME_##K##_##c \
      PACKSCHED_SCHEMA_SAME_##K##_##d PACKSCHED_SCHEMA_SAME_##K##_##e                             \
          PACKSCHED_SCHEMA_SAME_##K##_##f PACKSCHED_SCHEMA_SAME_##K##_##g                         \
              PACKSCHED_SCHEMA_SAME_##K##_##h
#define PACKSCHED_SCHEMA_IN(Kind, ...)                                                             \
  PACKSCHED_SCHEMA_THIRD(PACKSCHED_SCHEMA_SAME_EACH(Kind, __VA_ARGS__, _, _, _, _, _, _, _, _), 1, \
                         0, 0)
#define PACKSCHED_SCHEMA_PICK_0(prefix, Kind) PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_SCHEMA_PICK_1(prefix, Kind) prefix##_##Kind
#define PACKSCHED_SCHEMA_SKIP_0(prefix, Kind) prefix##_##Kind
#define PACKSCHED_SCHEMA_SKIP_1(prefix, Kind) PACKSCHED_SCHEMA_NOTHING
// Every rule and kind of the tables above (a new one adds its line; the static_asserts below
// fail without it).
#define PACKSCHED_SCHEMA_SAME_Align_Align ,
#define PACKSCHED_SCHEMA_SAME_Bool_Bool ,
#define PACKSCHED_SCHEMA_SAME_Bytes_Bytes ,
#define PACKSCHED_SCHEMA_SAME_Cap_Cap ,
#define PACKSCHED_SCHEMA_SAME_Ceiling_Ceiling ,
#define PACKSCHED_SCHEMA_SAME_Checked_Checked ,
#define PACKSCHED_SCHEMA_SAME_Count_Count ,
#define PACKSCHED_SCHEMA_SAME_Double_Double ,
#define PACKSCHED_SCHEMA_SAME_Enum_Enum ,
#define PACKSCHED_SCHEMA_SAME_FixedK_FixedK ,
#define PACKSCHED_SCHEMA_SAME_Global_Global ,
#define PACKSCHED_SCHEMA_SAME_Indices_Indices ,
#define PACKSCHED_SCHEMA_SAME_Int_Int ,
#define PACKSCHED_SCHEMA_SAME_Ints_Ints ,
#define PACKSCHED_SCHEMA_SAME_Kept_Kept ,
#define PACKSCHED_SCHEMA_SAME_Layouts_Layouts ,
#define PACKSCHED_SCHEMA_SAME_LocalK_LocalK ,
#define PACKSCHED_SCHEMA_SAME_Loss_Loss ,
#define PACKSCHED_SCHEMA_SAME_LossScale_LossScale ,
#define PACKSCHED_SCHEMA_SAME_MaxCp_MaxCp ,
#define PACKSCHED_SCHEMA_SAME_Micros_Micros ,
#define PACKSCHED_SCHEMA_SAME_Nodes_Nodes ,
#define PACKSCHED_SCHEMA_SAME_Parts_Parts ,
#define PACKSCHED_SCHEMA_SAME_Ratio_Ratio ,
#define PACKSCHED_SCHEMA_SAME_Rollouts_Rollouts ,
#define PACKSCHED_SCHEMA_SAME_Stats_Stats ,
#define PACKSCHED_SCHEMA_SAME_SumNorm_SumNorm ,
#define PACKSCHED_SCHEMA_SAME_Tree_Tree ,
#define PACKSCHED_SCHEMA_SAME_Unlimited_Unlimited ,
#define PACKSCHED_SCHEMA_SAME_Weight_Weight ,
#define PACKSCHED_SCHEMA_SAME_Weights_Weights ,
#define PACKSCHED_SCHEMA_SAME_World_World ,
#define PACKSCHED_SCHEMA_KNOWN(name, number, Kind, ...)                               \
  static_assert(PACKSCHED_SCHEMA_IN(Kind, Kind),                                      \
                "server/planner/schema.h: add PACKSCHED_SCHEMA_SAME_" #Kind "_" #Kind \
                " (a rule or kind of a table)");
PACKSCHED_PLAN_OPTIONS(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_LOSS_OPTIONS(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_MICRO_BATCH(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_PLAN_STATS(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_PLAN_RESPONSE(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_FOREST(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_TREE_LAYOUT(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_TREE_PLAN(PACKSCHED_SCHEMA_KNOWN)
PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_SCHEMA_KNOWN)
#undef PACKSCHED_SCHEMA_KNOWN
static_assert(PACKSCHED_SCHEMA_IN(Parts, Count, LocalK, Parts) &&
                  !PACKSCHED_SCHEMA_IN(Parts, Count, LocalK, Indices, Weights, Global, Stats, Tree),
              "PACKSCHED_SCHEMA_IN: a kind is in a list that names it, and only then");

// The plan options' and the response's names and rules / kinds as constants, for code that names
// one field (e.g. "--equal_size needs --num_parts=K"): schema::OptionNamed("FixedK"),
// schema::ResponseNamed("Weights").
namespace packsched::planner::schema {

struct OptionField {
  absl::string_view name;
  absl::string_view rule;  // the Rule column (the response's Kind)
};

#define PACKSCHED_SCHEMA_OPTION_FIELD(name, number, Rule, Type, member, json, help) \
  OptionField{#name, #Rule},
inline constexpr OptionField kPlanOptions[] = {
    PACKSCHED_PLAN_OPTIONS(PACKSCHED_SCHEMA_OPTION_FIELD)};
#undef PACKSCHED_SCHEMA_OPTION_FIELD

// The name of the first plan option of `rule` ("" if none): Cap, Ceiling and FixedK have one.
constexpr absl::string_view OptionNamed(absl::string_view rule) {
  for (const OptionField& field : kPlanOptions) {
    if (field.rule == rule) return field.name;
  }
  return "";
}

#define PACKSCHED_SCHEMA_RESPONSE_FIELD(name, number, Kind) OptionField{#name, #Kind},
inline constexpr OptionField kPlanResponse[] = {
    PACKSCHED_PLAN_RESPONSE(PACKSCHED_SCHEMA_RESPONSE_FIELD)};
#undef PACKSCHED_SCHEMA_RESPONSE_FIELD

// The name of the first PlanResponse field of `kind` ("" if none): Count, LocalK, Parts,
// Weights, Global and Stats have one.
constexpr absl::string_view ResponseNamed(absl::string_view kind) {
  for (const OptionField& field : kPlanResponse) {
    if (field.rule == kind) return field.name;
  }
  return "";
}

}  // namespace packsched::planner::schema

#endif  // PACKSCHED_SERVER_PLANNER_SCHEMA_H_
