// kernels/embedding.h — row gathers from a table (token and position embeddings).
//
//   embedding:           out[i, :] = table[ids[i], :]                         (=)
//   embedding_backward:  d_table[v, :] = Σ_{i : ids[i] = v} d_out[i, :]       (=; rows no id
//                        names are 0)
// ids is an i32 vector [N]; table [V, C]; out / d_out [N, C]. An id outside [0, V) is an
// error naming the op, the position and the value (checked before any kernel reads it).
// The backward is deterministic without float atomics: on the GPU the ids are sorted
// (stable radix sort) and each table row sums its occurrences in position order, in fp32.
#pragma once

#include "core/tensor.h"

namespace ffn {

// check_ids = false skips the range check (a device sync on the GPU); only for ids the caller
// built itself, e.g. positions 0..T-1 with T <= the table size.
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids = true);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table,
                        bool check_ids = true);

namespace cpu {
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table);
}  // namespace cpu
namespace cuda {
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table);
// First position i with ids[i] outside [0, limit), or -1 (synchronizes with the device).
int64_t first_bad_index(const Tensor& ids, int64_t limit);
}  // namespace cuda

}  // namespace ffn
