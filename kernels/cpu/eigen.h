// kernels/cpu/eigen.h — Eigen views of row-major tensors for the CPU references.
#pragma once

#include <Eigen/Dense>

#include "core/tensor.h"

namespace ffn::cpu {

template <class T>
using MatRM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapRM = Eigen::Map<MatRM<T>>;
template <class T>
using CMapRM = Eigen::Map<const MatRM<T>>;

// A contiguous 2-D tensor as an Eigen matrix (no copy).
template <class T>
MapRM<T> as_matrix(const Tensor& t) {
  return MapRM<T>(t.data<T>(), t.size(0), t.size(1));
}
template <class T>
CMapRM<T> as_cmatrix(const Tensor& t) {
  return CMapRM<T>(t.data<T>(), t.size(0), t.size(1));
}

}  // namespace ffn::cpu
