// core/device.cpp — device names and GPU discovery.
#include "core/device.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

#if FFN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ffn {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::optional<Device> Device::try_parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string num = s.substr(5);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 4)
      return std::nullopt;
    const int i = std::stoi(num);
    if (i < 1024) return cuda(i);
  }
  return std::nullopt;
}

Device Device::parse(const std::string& s) {
  if (const auto d = try_parse(s)) return *d;
  FFN_THROW("[device] cannot parse device '", s, "' (expected cpu, cuda or cuda:N)");
}

std::optional<DeviceRequest> DeviceRequest::try_parse(const std::string& s) {
  if (s == "auto") return DeviceRequest{};
  if (const auto d = Device::try_parse(s)) return DeviceRequest{*d};
  return std::nullopt;
}

std::string DeviceRequest::str() const {
  return device ? device->str() : std::string("auto");
}

Device resolve_device(const DeviceRequest& r, const std::string& what) {
  const int n = cuda_device_count();
  if (!r.device) return n > 0 ? Device::cuda(0) : Device::cpu();
  const Device d = *r.device;
  if (d.is_cuda() && d.index >= n)
    throw Error("[config] " + what + ": \"" + d.str() + "\" requested but " +
                    (n == 0 ? cuda_unavailable_reason()
                            : "only " + std::to_string(n) + " GPU(s) are visible"),
                ErrorKind::config);
  return d;
}

bool built_with_cuda() {
  return FFN_WITH_CUDA != 0;
}

int cuda_device_count() {
#if FFN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

uint64_t device_memory_bytes(Device d) {
#if FFN_WITH_CUDA
  if (d.is_cuda()) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d.index) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return p.totalGlobalMem;
  }
#endif
  if (d.is_cuda()) return 0;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

Device resolve_device_spec(const std::string& spec, const std::string& what) {
  const auto r = DeviceRequest::try_parse(spec);
  if (!r)
    throw Error("[config] " + what + ": expected auto, cpu, cuda or cuda:N, got '" + spec + "'",
                ErrorKind::config);
  return resolve_device(*r, what);
}

std::string cuda_unavailable_reason() {
#if FFN_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Without a driver the runtime reports cudaErrorInsufficientDriver ("driver version is
    // insufficient"), which reads as an outdated driver; say what it usually means.
    if ((e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) &&
        !std::filesystem::exists("/dev/nvidiactl"))
      return std::string("no GPU here (no NVIDIA driver loaded: /dev/nvidiactl is absent; the "
                         "CUDA runtime says \"") + cudaGetErrorString(e) + "\")";
    return std::string("no usable GPU (") + cudaGetErrorString(e) + ")";
  }
  return n > 0 ? std::string("CUDA is available") : std::string("no GPU was found");
#else
  return "fused-ffn was built without CUDA (no nvcc found at configure time)";
#endif
}

}  // namespace ffn
