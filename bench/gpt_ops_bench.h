// bench/gpt_ops_bench.h — ffn-bench's single-op benchmarks of a GPT-2 step beside the FFN
// (bench/gpt_ops_bench.cpp): each prints JSON lines with ms and the bytes or FLOPs per second.
#pragma once

#include <string>

namespace ffn::bench {

void xent_bench(int device, int warmup, int iters);       // --xent: the classifier
void norm_bench(int device, int warmup, int iters);       // --norm: residual add + norm
void norm_epilogue_bench(int device, int warmup, int iters);  // --norm: ... in the GEMM
// --norm, --rms-fold: RMSNorm in the QKV GEMM; variant "both" (alternated), "on" or "off";
// only the cases whose name contains `only` (empty: all).
void rms_fold_bench(int device, int warmup, int iters, const std::string& variant = "both",
                    const std::string& only = "");
void optimizer_bench(int device, int warmup, int iters);  // --optimizer: grad norm, AdamW
void attention_bench(int device, int warmup, int iters, float p_drop);  // --attention

}  // namespace ffn::bench
