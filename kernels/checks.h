// kernels/checks.h — argument checks shared by the fused elementwise ops' front doors
// (defined in kernels/checks.cpp). Each names the op and the offending values.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn::detail {

// p must be a number in [0, 1].
void check_dropout(const DropoutSpec& d, const char* op);
// Defined and 2-D.
void check_matrix(const Tensor& t, const char* op, const char* name);
// Defined, of `shape`, on ref's device and dtype, contiguous (outputs are written in place).
void check_like(const Tensor& t, const Tensor& ref, const Shape& shape, const char* op,
                const char* name);
// The fused GEMMs' front doors (linear_act, linear_dropout, linear_glu, their backwards): d's
// p in [0, 1], a and w 2-D, w on a's device and dtype and contiguous, and a's columns (K)
// matching w: w [rows, K] for a·wᵀ (nt), [K, cols] for a·w, and shape_ok (the caller's own
// condition on w). The error names the op, both shapes and the shape w should have, `free`
// naming w's other dimension (e.g. "h", "2h").
void check_linear(const DropoutSpec& d, const Tensor& a, const Tensor& w, bool nt, const char* op,
                  const char* a_name, const char* free, bool shape_ok = true);
// Contiguous with a 16-byte aligned start: what the fused Hopper GEMMs' TMA and 16-byte
// accesses need (their front doors decline otherwise).
bool dense16(const Tensor& t);

}  // namespace ffn::detail

namespace ffn::detail {

// ids: a defined, contiguous i32 vector; every entry in [0, limit). The error names the op,
// the tensor, the first bad position and its value (on the GPU this reads back one int).
// check_range = false keeps the dtype/layout checks and skips the value scan (on the GPU,
// a device sync), for ids the caller knows are in range.
void check_indices(const Tensor& ids, int64_t limit, const char* op, const char* name,
                   bool check_range = true);

}  // namespace ffn::detail
