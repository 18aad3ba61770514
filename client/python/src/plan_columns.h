#ifndef PACKSCHED_CLIENT_PYTHON_SRC_PLAN_COLUMNS_H_
#define PACKSCHED_CLIENT_PYTHON_SRC_PLAN_COLUMNS_H_

// Plans as columns for Python (packsched._planner.plan_columns, balance_columns): numpy arrays
// over all the micro-batches and sequences of one or many plans, handed over without converting a
// value to a Python object, so that a call returns in about the planner's own time;
// packsched.plan builds a rank's Plan and its lists only when they are read.

#include <pybind11/pybind11.h>

#include <vector>

#include "server/planner/plan.h"

namespace packsched::planner::python {

// The plans `plans` (one for plan / partition, one per rank for balance), moved out (each is left
// empty), as a dict of 1-D numpy arrays whose buffers Python owns (capsules; no copy of a
// per-plan vector when there is one plan):
//   "plan_parts"                 int64 [R + 1]: plan r's micro-batches are [plan_parts[r],
//                                plan_parts[r + 1]) of the micro-batch columns
//   per MicroBatch field (PACKSCHED_MICRO_BATCH), by Kind:
//     Int                        int64 [P]
//     Bool                       bool [P]
//     Ints  name, name_offsets   the P lists end to end (indices int64, cu_seqlens int32) and
//                                int64 [P + 1] offsets
//     LossScale                  nothing (the loss weights add it)
//   per index list (PACKSCHED_PLAN_RESPONSE's Indices: reorder, revert, dropped)
//                 name, name_offsets   the R lists end to end, int64 [R + 1] offsets
//   "stats"                      per PlanStats field the planner fills, an [R] array (int64 or
//                                float64), keyed by its name
// Requires the GIL.
pybind11::dict PlanColumns(const std::vector<MicroBatchPlan*>& plans);

}  // namespace packsched::planner::python

#endif  // PACKSCHED_CLIENT_PYTHON_SRC_PLAN_COLUMNS_H_
