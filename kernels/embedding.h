// kernels/embedding.h — row gathers from a table (token and position embeddings).
//
//   embedding:           out[i, :] = table[ids[i], :]                         (=)
//   embedding_sum:       out[i, :] = table[ids[i], :] + pos[i % t, :]         (=; pos optional)
//   embedding_backward:  d_table[v, :] = Σ_{i : ids[i] = v} d_out[i, :]       (=; rows no id
//                        names are 0; with accumulate, added to what d_table holds and rows
//                        no id names are left as they are)
//   position_grad:       d_pos[p, :] = Σ_{i : i % t = p} d_out[i, :]          (=; rows ≥ t are 0)
// ids is an i32 vector [N]; table [V, C]; out / d_out [N, C], in table's dtype or, for a
// 16-bit table, fp32 (the residual stream, Note [Embeddings in one pass]); pos [P, C] like
// table, 1 ≤ t ≤ P, N a multiple of t. An id outside [0, V) is an error naming the op, the
// position and the value (checked before any kernel reads it). The backward is
// deterministic without float atomics: on the GPU the ids are sorted (stable radix sort) and
// each table row sums its occurrences in position order, in fp32; position_grad sums the
// sequences in order.
//
// Note [Embeddings in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A GPT's residual stream starts as wte[ids] + wpe[positions], in fp32 when the parameters
// are 16-bit (Note [Mixed-precision residual stream] in layers/transformer.cpp).
// fn::embedding_sum (layers/functional.h) makes it in one pass (embedding_sum: the sum in
// fp32, rounded once to out's dtype, the values two gathers, a cast and an add gave) and
// takes its gradient back in two: embedding_backward reads the fp32 gradient itself (no
// cast pass to 16 bits first) and, where the table is tied to the LM head, adds into the
// head's gradient already summed for it (Note [Accumulating backward] in core/autograd.h: no
// zeroed [V, C] table and no separate add of the two), and position_grad sums the position
// rows without a sort. gpt2_small's step ran these as two gathers, a cast, an add, a cast
// back, two sorted scatters, a 77 MB memset and a 77 MB add.
#pragma once

#include "core/tensor.h"

namespace ffn {

// check_ids = false skips the range check (a device sync on the GPU); only for ids the caller
// built itself, e.g. positions 0..T-1 with T <= the table size.
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids = true);
// pos undefined: embedding (t ignored).
void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out, bool check_ids = true);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table,
                        bool check_ids = true, bool accumulate = false);
void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos);

namespace cpu {
void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool accumulate);
void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos);
}  // namespace cpu
namespace cuda {
void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool accumulate);
void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos);
// First position i with ids[i] outside [0, limit), or -1 (synchronizes with the device).
int64_t first_bad_index(const Tensor& ids, int64_t limit);
}  // namespace cuda

}  // namespace ffn
