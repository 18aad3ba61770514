#ifndef PACKSCHED_CLIENT_PYTHON_SRC_PLANNER_SCHEMA_H_
#define PACKSCHED_CLIENT_PYTHON_SRC_PLANNER_SCHEMA_H_

// The schema table of server/planner/schema.h for Python (packsched._planner.schema()).

#include <pybind11/pybind11.h>

namespace packsched::planner::python {

// Every row of every table as a dict, one list per table in table order ("plan_options",
// "round_options", "loss_options", "micro_batch", "plan_stats", "global_counts",
// "plan_response", and "weight_pair": the key of the weight pair). An enum option's `choices`
// are the planner's names in enum order (proto value = index + 1); `default` is the planner's
// default in Python terms (an enum's name). Requires the GIL.
pybind11::dict Schema();

}  // namespace packsched::planner::python

#endif  // PACKSCHED_CLIENT_PYTHON_SRC_PLANNER_SCHEMA_H_
