// core/tensor.cpp — tensor construction, views, copies and dtype/device moves.
#include "core/tensor.h"

#include <cstring>
#include <numeric>
#include <sstream>

#include "core/cuda/copy.h"
#include "core/dispatch.h"
#include "core/generator.h"

namespace ffn {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    FFN_CHECK(d >= 0, "[tensor] negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ =
      allocate_storage(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device) {
  FFN_CHECK(data != nullptr, "[tensor] borrow: null data for shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(
      data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device, true);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, Device device, double mean,
                     double std) {
  if (device.is_cuda()) {  // drawn on the device: same Philox words, see philox_normal4
    Tensor t = empty(shape, dtype, device);
    cuda_copy::fill_normal(t, gen.seed(), gen.next_offset(), mean, std);
    return t;
  }
  Tensor host = empty(shape, DType::f64);
  double* p = host.data<double>();
  const uint64_t offset = gen.next_offset();
  const int64_t n = host.numel();
  float z[4];
  for (int64_t i = 0; i < n; ++i) {
    if ((i & 3) == 0) philox_normal4(gen.seed(), offset, static_cast<uint64_t>(i) >> 2, z);
    p[i] = mean + std * static_cast<double>(z[i & 3]);
  }
  return host.to(dtype).to(device);
}

Tensor Tensor::uniform(const Shape& shape, Generator& gen, double lo, double hi, DType dtype,
                       Device device) {
  Tensor host = empty(shape, DType::f64);
  double* p = host.data<double>();
  const uint64_t offset = gen.next_offset();
  const int64_t n = host.numel();
  U32x4 r{};
  for (int64_t i = 0; i < n; ++i) {
    if ((i & 3) == 0) r = philox_block(gen.seed(), offset, static_cast<uint64_t>(i) >> 2);
    p[i] = lo + (hi - lo) * (static_cast<double>(r.v[i & 3]) / 4294967296.0);
  }
  return host.to(dtype).to(device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype,
                           Device device) {
  FFN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "[tensor] from_vector got ",
            values.size(), " values for shape ", shape_str(shape));
  Tensor host = empty(shape, DType::f64);
  std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(double));
  return host.to(dtype).to(device);
}

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t k = d < 0 ? d + nd : d;
  FFN_CHECK(k >= 0 && k < nd, "[tensor] dim ", d, " out of range for shape ", shape_str(shape_));
  return shape_[k];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device_.str();
}

void* Tensor::data_ptr() const {
  FFN_CHECK(defined(), "[tensor] data access on an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      FFN_CHECK(infer < 0, "[reshape] more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      FFN_CHECK(s[i] >= 0, "[reshape] negative dimension in ", shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    FFN_CHECK(known > 0 && numel() % known == 0, "[reshape] cannot reshape ", shape_str(shape_),
              " to ", shape_str(shape));
    s[infer] = numel() / known;
  }
  FFN_CHECK(shape_numel(s) == numel(), "[reshape] cannot reshape ", shape_str(shape_), " (",
            numel(), " elements) to ", shape_str(shape));
  Tensor t = contiguous();
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::view_2d() const {
  FFN_CHECK(dim() >= 1, "[view_2d] needs at least one dimension, got ", shape_str(shape_));
  return reshape({shape_numel(Shape(shape_.begin(), shape_.end() - 1)), size(-1)});
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const int64_t k = d < 0 ? d + dim() : d;
  FFN_CHECK(k >= 0 && k < dim(), "[narrow] dim ", d, " out of range for shape ", shape_str(shape_));
  FFN_CHECK(start >= 0 && length >= 0 && start + length <= shape_[k], "[narrow] range [", start,
            ", ", start + length, ") out of bounds for dim ", d, " of size ", shape_[k]);
  Tensor t = *this;
  t.offset_ += start * strides_[k];
  t.shape_[k] = length;
  return t;
}

std::vector<Tensor> Tensor::chunk(int64_t n, int64_t d) const {
  const int64_t size_d = size(d);
  FFN_CHECK(n > 0 && size_d % n == 0, "[chunk] dim ", d, " of size ", size_d,
            " does not split into ", n, " equal chunks");
  std::vector<Tensor> out;
  const int64_t len = size_d / n;
  for (int64_t i = 0; i < n; ++i) out.push_back(narrow(d, i * len, len));
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  FFN_CHECK(static_cast<int64_t>(dims.size()) == dim(), "[permute] got ", dims.size(),
            " dims for a ", dim(), "-D tensor ", desc());
  std::vector<bool> seen(dims.size(), false);
  Tensor t = *this;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    FFN_CHECK(d >= 0 && d < dim() && !seen[d], "[permute] dims ", shape_str(dims),
              " is not a permutation of 0..", dim() - 1);
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device_);
  t.copy_(*this);
  return t;
}

namespace {

// Strided element-wise copy with conversion on the host (odometer over the index space).
template <class D, class S>
void cpu_copy_typed(const Tensor& dst, const Tensor& src) {
  D* d = static_cast<D*>(dst.data_ptr());
  const S* s = static_cast<const S*>(src.data_ptr());
  const int64_t n = dst.numel();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if constexpr (std::is_same_v<D, S>) {
      std::memcpy(d, s, static_cast<size_t>(n) * sizeof(D));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = detail::cast_value<D>(s[i]);
    }
    return;
  }
  const int64_t nd = dst.dim();
  std::vector<int64_t> idx(nd, 0);
  int64_t od = 0, os = 0;
  for (int64_t i = 0; i < n; ++i) {
    d[od] = detail::cast_value<D>(s[os]);
    for (int64_t k = nd - 1; k >= 0; --k) {
      if (++idx[k] < dst.shape()[k]) {
        od += dst.strides()[k];
        os += src.strides()[k];
        break;
      }
      od -= (idx[k] - 1) * dst.strides()[k];
      os -= (idx[k] - 1) * src.strides()[k];
      idx[k] = 0;
    }
  }
}

void cpu_copy(const Tensor& dst, const Tensor& src) {
  FFN_DISPATCH_ANY(dst.dtype(), "copy", [&]<class D>() {
    FFN_DISPATCH_ANY(src.dtype(), "copy", [&]<class S>() { cpu_copy_typed<D, S>(dst, src); });
  });
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  check_defined(*this, "copy_", "dst");
  check_defined(src, "copy_", "src");
  FFN_CHECK(shape_ == src.shape_, "[copy_] shape mismatch: dst ", shape_str(shape_), " vs src ",
            shape_str(src.shape_));
  if (numel() == 0) return;
  if (device_.is_cpu() && src.device_.is_cpu()) {
    cpu_copy(*this, src);
    return;
  }
  if (device_ == src.device_) {
    cuda_copy::copy_same_device(*this, src);
    return;
  }
  // Across devices: convert and compact on the source side, move bytes, then scatter.
  const Tensor s = src.to(dtype_).contiguous();
  Tensor d = is_contiguous() ? *this : Tensor::empty(shape_, dtype_, device_);
  cuda_copy::memcpy_between(d.data_ptr(), device_, s.data_ptr(), s.device_, nbytes());
  if (d.storage_ != storage_) copy_(d);
}

void Tensor::fill_(double value) {
  check_defined(*this, "fill_", "self");
  if (numel() == 0) return;
  if (device_.is_cuda()) {
    cuda_copy::fill(*this, value);
    return;
  }
  Tensor one = empty({1}, DType::f64);
  *one.data<double>() = value;
  Tensor src = one;
  src.shape_ = shape_;
  src.strides_ = Shape(shape_.size(), 0);  // broadcast the single value
  cpu_copy(*this, src);
}

namespace {
// The operands of add_ and plus: defined, same shape and device, both float (dtypes may
// differ: the other one is converted on the fly).
void check_sum_operands(const Tensor& self, const Tensor& other, const char* op) {
  check_defined(self, op, "self");
  check_defined(other, op, "other");
  FFN_CHECK(self.shape() == other.shape(), "[", op, "] shape mismatch: self ",
            shape_str(self.shape()), " vs other ", shape_str(other.shape()));
  FFN_CHECK(is_float(self.dtype()) && is_float(other.dtype()), "[", op, "] dtype ",
            dtype_name(is_float(self.dtype()) ? other.dtype() : self.dtype()),
            " is not supported here (expected a float type)");
  check_same_device(self, other, op, "self", "other");
}
}  // namespace

Tensor Tensor::plus(const Tensor& other) const {
  check_sum_operands(*this, other, "plus");
  if (device_.is_cuda() && numel() > 0) {
    Tensor out = empty(shape_, dtype_, device_);
    cuda_copy::add(out, contiguous(), other.contiguous());
    return out;
  }
  Tensor out = clone();
  out.add_(other);
  return out;
}

void Tensor::add_(const Tensor& other, double alpha) {
  check_sum_operands(*this, other, "add_");
  FFN_CHECK(is_contiguous(), "[add_] self must be contiguous, got strides ", shape_str(strides_));
  const Tensor src = other.contiguous();
  if (numel() == 0) return;
  if (device_.is_cuda()) {
    cuda_copy::axpy(*this, src, alpha);
    return;
  }
  const Tensor same = src.to(dtype_);  // other may be any float dtype
  FFN_DISPATCH_ALL(dtype_, "add_", [&]<class T>() {
    T* d = data<T>();
    const T* s = same.data<T>();
    const int64_t n = numel();
    for (int64_t i = 0; i < n; ++i)
      d[i] = detail::cast_value<T>(detail::cast_value<double>(d[i]) +
                                   alpha * detail::cast_value<double>(s[i]));
  });
}

std::vector<double> Tensor::to_vector() const {
  Tensor h = to(Device::cpu()).to(DType::f64).contiguous();
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

double Tensor::item() const {
  FFN_CHECK(numel() == 1, "[item] needs a one-element tensor, got ", desc());
  return to_vector()[0];
}

void check_defined(const Tensor& t, const char* op, const char* name) {
  FFN_CHECK(t.defined(), "[", op, "] ", name, " is an undefined tensor");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* na,
                       const char* nb) {
  FFN_CHECK(a.device() == b.device(), "[", op, "] device mismatch: ", na, " is on ",
            a.device().str(), " but ", nb, " is on ", b.device().str());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* na,
                      const char* nb) {
  FFN_CHECK(a.dtype() == b.dtype(), "[", op, "] dtype mismatch: ", na, " is ",
            dtype_name(a.dtype()), " but ", nb, " is ", dtype_name(b.dtype()));
}

void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  FFN_CHECK(t.shape() == expected, "[", op, "] ", name, ".shape=", shape_str(t.shape()),
            " but expected ", shape_str(expected));
}

void check_dim(const Tensor& t, int64_t dim, const char* op, const char* name) {
  FFN_CHECK(t.dim() == dim, "[", op, "] ", name, " must be ", dim, "-D, got shape ",
            shape_str(t.shape()));
}

}  // namespace ffn
