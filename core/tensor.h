// core/tensor.h — the n-dimensional array every op works on.
//
// A Tensor is a view: shared Storage + element offset + shape + strides (in
// elements, 64-bit). Copying a Tensor copies the view, not the data. Views
// (reshape of contiguous data, narrow/slice_rows, chunk along a dim) share
// storage; contiguous(), clone(), to() make new storage when they must.
// Kernels take contiguous tensors (ops call contiguous() on their inputs), so
// strided views are always accepted, at the cost of a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace ffn {

class Generator;
using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() == false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // Normal(mean, std) / Uniform[lo, hi) from a fresh stream of `gen`. Uniform is drawn on
  // the host; randn is drawn where the tensor lives (CUDA and host normals may differ in
  // the last bit, see philox_normal4).
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32,
                      Device device = Device::cpu(), double mean = 0.0, double std = 1.0);
  static Tensor uniform(const Shape& shape, Generator& gen, double lo, double hi,
                        DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::f32, Device device = Device::cpu());
  // A contiguous tensor over memory fused-ffn did not allocate and never frees (an NCCL
  // window: train/dist/comm.cpp); its owner keeps it alive while any view of it is used.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // "f32[7, 13] on cpu"
  std::string desc() const;

  void* data_ptr() const;
  template <class T>
  T* data() const {
    FFN_CHECK(dtype_of<T>() == dtype_, "[tensor] data<", dtype_name(dtype_of<T>()),
              ">() on a tensor of dtype ", dtype_name(dtype_));
    return static_cast<T*>(data_ptr());
  }

  // Views (share storage).
  Tensor reshape(const Shape& shape) const;  // copies first if not contiguous; one -1 allowed
  Tensor view_2d() const;                    // [prod(shape[:-1]), shape[-1]]
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice_rows(int64_t begin, int64_t end) const { return narrow(0, begin, end - begin); }
  std::vector<Tensor> chunk(int64_t n, int64_t dim = -1) const;
  // Reorders dimensions: result.shape[i] = shape[dims[i]] (a strided view; no copy).
  Tensor permute(const std::vector<int64_t>& dims) const;

  // Copies.
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // *this when already there
  Tensor to(DType dtype) const;    // *this when already that dtype; fp32 math for 16-bit types
  // Copies src into *this (same shape; any dtype, device and strides on either side).
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_() { fill_(0.0); }
  // *this += alpha * other (same shape; other may be another float dtype, converted on the
  // fly; *this contiguous). Used by autograd's sums and mixed-precision residual adds.
  void add_(const Tensor& other, double alpha = 1.0);
  // *this + other as a new contiguous tensor in this dtype (same shape; other may be another
  // float dtype). One pass on the GPU, where clone() + add_() would take two.
  Tensor plus(const Tensor& other) const;

  // Host-side readback for tests and logging (converts to double).
  std::vector<double> to_vector() const;
  double item() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::f32;
  Device device_;
};

Shape contiguous_strides(const Shape& shape);

// Validation helpers used by every op; they name the op and the tensor.
void check_defined(const Tensor& t, const char* op, const char* name);
void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* na,
                       const char* nb);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* na,
                      const char* nb);
void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name);
void check_dim(const Tensor& t, int64_t dim, const char* op, const char* name);

}  // namespace ffn
