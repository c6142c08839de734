// layers/branch_bias_grad.h — the hand-over of a bias gradient between autograd nodes: a node
// whose backward already reads its input's gradient sums its columns and gives the sum to the
// node that made that input (Note [Branch bias gradient]). Internal to layers/.
#pragma once

#include <utility>

#include "core/tensor.h"

namespace ffn::fn {

// Note [Branch bias gradient]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a pre-norm block the outputs of attention's projection and of the FFN's fc2 are the
// branches h of residual adds a = x + dropout(h), and the norm that reads a writes h's
// gradient dh in its backward (Note [Residual add and norm]). Those layers' bias gradient is
// the column sum of that dh, which the norm's backward then sums in the same pass
// (BranchGrad::dh_sum) instead of a column-sum pass over dh of its own (0.43 ms of
// gpt2_small's step, 24 of its 36 passes, session 17's profile). The norm's node asks the
// node that made h (a BranchBiasGrad) whether it wants the sum, and hands it over with the
// address of the dh it was taken from; that node uses it only for exactly that d_out (else
// it sums as before). The address alone would not do: when h has another user whose
// gradient the engine adds into dh in place (it arrives later, or arrived earlier and dh
// lands in its sum), the d_out differs from dh. So the residual add, which hands dh to the
// engine, withdraws the sum unless nothing has been summed for h before it and no node left
// to run feeds h (sums[1] null, sums_final[1]: Note [Accumulating backward]).
// The fused attention's backward does the same for the QKV projection (layers/attention.cpp):
// its kernels write dqkv and can sum its columns as they go, so it hands the sum to the
// projection when dqkv is all of qkv's gradient (sums[0] null, sums_final[0]).
class BranchBiasGrad {
 public:
  virtual ~BranchBiasGrad() = default;
  // Whether backward will need the column sums of its d_out as its bias gradient.
  virtual bool wants_bias_grad_of_output() const = 0;
  void set_bias_grad_of_output(Tensor db, const void* src) {
    given_db_ = std::move(db);
    given_src_ = src;
  }
  void withdraw_bias_grad_of_output() { forget_given_db(); }

 protected:
  // The given sum if `dy` is the gradient it was taken from, else undefined; forgets it.
  Tensor take_given_db(const Tensor& dy) {
    Tensor db = given_src_ && dy.data_ptr() == given_src_ ? given_db_ : Tensor();
    forget_given_db();
    return db;
  }
  void forget_given_db() {
    given_db_ = Tensor();
    given_src_ = nullptr;
  }

 private:
  Tensor given_db_;
  const void* given_src_ = nullptr;
};

}  // namespace ffn::fn
