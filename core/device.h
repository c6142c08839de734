// core/device.h — where a tensor lives: the host ("cpu") or one GPU ("cuda:N").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ffn {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; try_parse gives nullopt instead of throwing.
  static Device parse(const std::string& s);
  static std::optional<Device> try_parse(const std::string& s);
};

// A device as a user asks for it: "auto", "cpu", "cuda" or "cuda:N".
struct DeviceRequest {
  std::optional<Device> device;  // nullopt: "auto"
  static std::optional<DeviceRequest> try_parse(const std::string& s);
  std::string str() const;
  bool operator==(const DeviceRequest&) const = default;
};
// The one place "auto" is decided (the first GPU when one is usable, else the CPU). A GPU
// asked for but not usable is a config error whose message starts with `what`
// (e.g. "runtime.device", "--device").
Device resolve_device(const DeviceRequest& r, const std::string& what);
// The same from the user's text (a command-line flag); malformed text is a config error too.
Device resolve_device_spec(const std::string& spec, const std::string& what);

// True when fused-ffn was compiled with its CUDA backend.
bool built_with_cuda();
// Number of usable GPUs; 0 in a CPU-only build or when no driver/GPU answers.
int cuda_device_count();
// Memory a device holds in total: physical RAM for the CPU, the GPU's global memory.
uint64_t device_memory_bytes(Device d);
// The reason cuda_device_count() is 0, for messages ("built without CUDA", driver error text).
std::string cuda_unavailable_reason();

}  // namespace ffn
