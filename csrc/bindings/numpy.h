// Vectors handed to NumPy without a copy: the array owns the vector (a capsule frees it).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

namespace stepscope {
namespace bindings {

template <typename T, typename A>
nanobind::object to_numpy(std::vector<T, A>&& v) {
  auto* heap = new std::vector<T, A>(std::move(v));
  nanobind::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T, A>*>(p); });
  size_t shape[1] = {heap->size()};
  return nanobind::cast(nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>>(heap->data(), 1, shape, owner));
}

}  // namespace bindings
}  // namespace stepscope
