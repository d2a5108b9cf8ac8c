// The analysis's native passes (csrc/aggregate/), as module functions.
#pragma once
#include <nanobind/nanobind.h>

namespace stepscope {
namespace bindings {

void add_aggregate(nanobind::module_& m);

}  // namespace bindings
}  // namespace stepscope
