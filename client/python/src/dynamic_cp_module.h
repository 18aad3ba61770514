#ifndef PACKSCHED_CLIENT_PYTHON_SRC_DYNAMIC_CP_MODULE_H_
#define PACKSCHED_CLIENT_PYTHON_SRC_DYNAMIC_CP_MODULE_H_

// packsched._planner.dynamic_cp: the dynamic context-parallel plan (server/planner/dynamic_cp.h)
// in-process; packsched/dynamic_cp.py wraps it.

#include <pybind11/pybind11.h>

namespace packsched::planner::python {

// Adds `dynamic_cp` to the module `m`.
void AddDynamicCp(pybind11::module_& m);

}  // namespace packsched::planner::python

#endif  // PACKSCHED_CLIENT_PYTHON_SRC_DYNAMIC_CP_MODULE_H_
