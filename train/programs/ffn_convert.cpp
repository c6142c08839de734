// train/programs/ffn_convert.cpp — `ffn-convert SRC DST --to hf-gpt2|nanogpt|ffn`: GPT weights
// between our layout and HuggingFace GPT-2's or nanoGPT's (Note [Weight layouts]). SRC is a
// run directory (its latest checkpoint), a ckpt-* directory or a .safetensors file in any of
// the three layouts (detected from its names); DST is the .safetensors file to write.
//
// Exit codes: 0 written; 1 an unreadable or damaged file; 2 bad options, or weights that do
// not form a GPT in the source layout or have no counterpart in the target (named).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/error.h"
#include "train/config.h"
#include "train/io/safetensors.h"
#include "train/programs/cli_checks.h"
#include "train/weights.h"

int main(int argc, char** argv) {
  using namespace ffn::train;
  CLI::App app{"ffn-convert: GPT weights between fused-ffn's layout and HuggingFace GPT-2's or "
               "nanoGPT's.\nExample: ffn-convert runs/gpt2 gpt2-hf.safetensors --to hf-gpt2",
               "ffn-convert"};
  std::string src, dst, to;
  app.add_option("src", src, "Run directory, ckpt-* directory or .safetensors file")->required();
  app.add_option("dst", dst, "The .safetensors file to write")->required();
  app.add_option("--to", to, "Target layout: hf-gpt2, nanogpt or ffn")->required();
  return ffn::train::run_program(app, argc, argv, "ffn-convert", /*newline=*/false,
                                 [&]() -> int {
    const WeightLayout target = parse_weight_layout(to);
    std::string file;
    const NamedTensors in = read_weights(src, &file);
    const WeightLayout from = detect_weight_layout(in, file);
    const NamedTensors out = from_ffn_layout(to_ffn_layout(in, file), target);
    save_safetensors(dst, out, {{"format", "pt"}});
    std::printf("ffn-convert: %s (%s, %zu tensors) -> %s (%s, %zu tensors)\n", file.c_str(),
                weight_layout_name(from), in.size(), dst.c_str(), weight_layout_name(target),
                out.size());
    return 0;
  });
}
