// bench/gpt_grads.cpp — `ffn-gpt-grads`: one forward and backward of a GPT on given weights and
// a deterministic batch, written out for bench/gpt_parity.py to compare with a PyTorch GPT-2
// (issue 18's parity check). The model shape comes from a config (a run's config.toml), the
// weights from a file in any layout (Note [Weight layouts]); the output .safetensors holds
//   tokens  i32 [B, T+1]   the batch (inputs are [:, :T], targets [:, 1:])
//   loss    f32 [1]        the mean cross-entropy
//   <name>  the gradient of each parameter, in the layout --layout asks for (hf-gpt2 by
//           default: the names and Conv1D orientation of the PyTorch model; a llama model's
//           own names, which are HF Llama's), at the precision the model ran in.
//
// Exit codes: 0 written; 1 a runtime error; 2 bad options or a config/weights mismatch.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

#include "core/error.h"
#include "core/philox.h"
#include "layers/transformer.h"
#include "train/config.h"
#include "train/io/safetensors.h"
#include "train/trainer.h"
#include "train/programs/cli_checks.h"
#include "train/weights.h"

int main(int argc, char** argv) {
  using namespace ffn;
  using namespace ffn::train;
  CLI::App app{"ffn-gpt-grads: loss and gradients of a GPT on given weights and a seeded batch",
               "ffn-gpt-grads"};
  std::string config, weights, out, precision = "fp32", device = "auto", layout = "hf-gpt2";
  int64_t batch = 4, seq = 64;
  uint64_t seed = 1;
  app.add_option("config", config, "A config file (e.g. RUN/config.toml): the model shape")
      ->required();
  app.add_option("weights", weights, "Weights: run dir, ckpt-* dir or .safetensors, any layout")
      ->required();
  app.add_option("out", out, "The .safetensors file to write")->required();
  app.add_option("--precision", precision, "fp32 or bf16 (parameters and compute)");
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N");
  app.add_option("--batch", batch, "Sequences")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "Tokens per sequence (<= model.context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of the token draw");
  app.add_option("--layout", layout, "Layout of the gradients: hf-gpt2, nanogpt or ffn");
  std::vector<std::string> sets;
  app.add_option("--set", sets, "KEY=VALUE config overrides (e.g. model.vocab_size=65)");
  return run_program(app, argc, argv, "ffn-gpt-grads", /*newline=*/false,
                     [&]() -> int {
    const Config cfg = Config::load(config, sets);
    FFN_CHECK(cfg.model.vocab_size > 0, "[ffn-gpt-grads] the config needs model.vocab_size");
    FFN_CHECK(precision == "fp32" || precision == "bf16",
              "[ffn-gpt-grads] --precision must be fp32 or bf16, got ", precision);
    const Device dev = resolve_device_spec(device, "--device");
    const DType dt = precision == "bf16" ? DType::bf16 : DType::f32;
    GptConfig g = gpt_config(cfg, cfg.model.vocab_size, dev, dt);
    g.dropout = 0.0f;
    Generator init(0);
    GPT model(g, std::make_shared<Generator>(0), init);

    // The weights, by name, into the model's stored view (Note [Padded vocabulary]).
    std::string file;
    // A llama model's names are HF Llama's already (layers/llama.h).
    const bool llama = cfg.model.arch == Arch::llama;
    const NamedTensors src = llama ? read_weights(weights, &file)
                                   : to_ffn_layout(read_weights(weights, &file), weights);
    std::map<std::string, Tensor> by_name(src.begin(), src.end());
    for (auto& [name, dst] : model.stored_view(values_of(model.named_parameters()))) {
      auto it = by_name.find(name);
      FFN_CHECK(it != by_name.end(), "[ffn-gpt-grads] '", file, "' has no '", name, "'");
      Tensor t = it->second;
      if (name == "wpe.weight" && t.size(0) > dst.size(0)) t = t.narrow(0, 0, dst.size(0));
      by_name.erase(it);
      FFN_CHECK(t.shape() == dst.shape(), "[ffn-gpt-grads] '", name, "' is ",
                shape_str(t.shape()), ", the config's model has ", shape_str(dst.shape()));
      dst.copy_(t);
    }

    FFN_CHECK(by_name.empty(), "[ffn-gpt-grads] '", file,
              "' has tensors the model does not (e.g. '",
              by_name.empty() ? std::string() : by_name.begin()->first, "')");
    // Tokens: Philox(seed) draws, uniform over the vocabulary.
    std::vector<double> ids(static_cast<size_t>(batch * (seq + 1)));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<double>(philox_block(seed, 7, i).v[0] %
                                   static_cast<uint32_t>(g.vocab_size));
    const Tensor tokens = Tensor::from_vector(ids, {batch, seq + 1}, DType::i32);
    const Tensor x = tokens.narrow(1, 0, seq).contiguous().to(dev);
    const Tensor y = tokens.narrow(1, 1, seq).contiguous().to(dev);
    Var loss = model.loss(x, y);
    loss.backward();

    NamedTensors grads;
    for (const auto& [name, v] : model.named_parameters()) grads.emplace_back(name, v.grad());
    grads = model.stored_view(grads);
    for (auto& [name, t] : grads) t = t.contiguous().to(Device::cpu());
    NamedTensors outs = llama ? grads : from_ffn_layout(grads, parse_weight_layout(layout));
    outs.emplace_back("tokens", tokens);
    outs.emplace_back("loss", loss.value().to(DType::f32).to(Device::cpu()).reshape({1}));
    save_safetensors(out, outs, {{"format", "pt"}});
    std::printf("ffn-gpt-grads: %s, %s on %s, batch %lldx%lld, loss %.6f -> %s\n", file.c_str(),
                dtype_name(dt), dev.str().c_str(), static_cast<long long>(batch),
                static_cast<long long>(seq), loss.value().item(), out.c_str());
    return 0;
  });
}
