// Test-only PrivateUse1 backend for devplug's tests: a real device type registered through PyTorch's
// open-registration API (never shipped). Its "device memory" is host memory from malloc; every operator
// without a kernel here runs through a boxed CPU fallback. The pieces follow what PyTorch documents for
// out-of-tree backends (docs "Extending dispatcher for a new backend in C++", and the test extension
// test/cpp_extensions/open_registration_extension/torch_openreg in pytorch/pytorch); the code is our own.
//
// Behaviour switches, read once when the library loads (tests start a fresh process for each variant):
//   DEVPLUG_OPENREG_NO_HOST_ALLOCATOR=1  no pinned (host) allocator: pinning host memory crashes the process,
//                                        as it does on backends that register none
//   DEVPLUG_OPENREG_MISSING=op1,op2      these operators have no kernel (aten names, e.g. addmm,linalg_vector_norm)
//   DEVPLUG_OPENREG_NO_AUTOCAST=1        no autocast kernels: entering torch.autocast works, the first
//                                        operator under it fails (as on backends that register none)
//   DEVPLUG_OPENREG_DEVICES=N            how many devices the backend reports (default 1)

#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace devplug_openreg {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatType;

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

c10::DeviceIndex env_devices() {
  const char* value = std::getenv("DEVPLUG_OPENREG_DEVICES");
  return value == nullptr ? 1 : static_cast<c10::DeviceIndex>(std::atoi(value));
}

const c10::DeviceIndex kDevices = env_devices();
const bool kNoHostAllocator = env_flag("DEVPLUG_OPENREG_NO_HOST_ALLOCATOR");
thread_local c10::DeviceIndex current_index = 0;

std::unordered_set<std::string> missing_operators() {
  std::unordered_set<std::string> names;
  const char* value = std::getenv("DEVPLUG_OPENREG_MISSING");
  std::stringstream list(value == nullptr ? "" : value);
  std::string name;
  while (std::getline(list, name, ',')) {
    if (!name.empty()) names.insert("aten::" + name);
  }
  return names;
}

const std::unordered_set<std::string> kMissing = missing_operators();

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kDevices, "openreg: no device ", static_cast<int>(index), " (", static_cast<int>(kDevices), " present)");
}

// ---- device memory: malloc, with the allocation counters torch.accelerator reports ----
struct DeviceMemory final : public c10::DeviceAllocator {
  std::mutex lock;
  std::unordered_map<void*, std::pair<size_t, c10::DeviceIndex>> live;
  std::vector<DeviceStats> stats = std::vector<DeviceStats>(std::max<int>(kDevices, 1));

  static void release(void* ptr);

  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex index = current_index;
    void* data = n == 0 ? nullptr : std::malloc(n);
    TORCH_CHECK(n == 0 || data != nullptr, "openreg: out of memory allocating ", n, " bytes");
    if (data != nullptr) {
      std::lock_guard<std::mutex> guard(lock);
      live[data] = {n, index};
      stats[index].allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].increase(n);
      stats[index].reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].increase(n);
    }
    return {data, data, &DeviceMemory::release, c10::Device(c10::DeviceType::PrivateUse1, index)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &DeviceMemory::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> guard(lock);
    return stats[device];
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> guard(lock);
    for (auto& stat : stats[device].allocated_bytes) stat.reset_accumulated();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> guard(lock);
    for (auto& stat : stats[device].allocated_bytes) stat.reset_peak();
    for (auto& stat : stats[device].reserved_bytes) stat.reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_index(device);
    const size_t total = size_t(1) << 32;  // a 4 GiB device
    std::lock_guard<std::mutex> guard(lock);
    const auto used = static_cast<size_t>(stats[device].allocated_bytes[0].current);
    return {total - std::min(used, total), total};
  }
};

DeviceMemory device_memory;

void DeviceMemory::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> guard(device_memory.lock);
    auto found = device_memory.live.find(ptr);
    if (found != device_memory.live.end()) {
      auto [n, index] = found->second;
      device_memory.stats[index].allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].decrease(n);
      device_memory.stats[index].reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].decrease(n);
      device_memory.live.erase(found);
    }
  }
  std::free(ptr);
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_memory);

// ---- pinned host memory (what DataLoader(pin_memory=True) asks the backend for) ----
struct HostMemory final : public c10::Allocator {
  mutable std::mutex lock;
  std::set<const void*> pinned;

  static void release(void* ptr);

  c10::DataPtr allocate(size_t n) override {
    void* data = n == 0 ? nullptr : std::malloc(n);
    if (data != nullptr) {
      std::lock_guard<std::mutex> guard(lock);
      pinned.insert(data);
    }
    return {data, data, &HostMemory::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &HostMemory::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  bool is_pinned(const void* ptr) const {
    std::lock_guard<std::mutex> guard(lock);
    return pinned.count(ptr) > 0;
  }
};

HostMemory host_memory;

void HostMemory::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> guard(host_memory.lock);
    host_memory.pinned.erase(ptr);
  }
  std::free(ptr);
}

// ---- device guard: the current device per thread, no streams beyond the default ----
struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device device) const override {
    auto previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, current_index); }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.is_privateuseone(), "openreg: not an openreg device: ", device);
    if (device.has_index()) {
      check_index(device.index());
      current_index = device.index();
    }
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) current_index = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int priority = 0) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override { return stream; }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeEvent(void*) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// ---- random numbers: the CPU's generator, placed on the device ----
struct Generator final : public at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> made;
    for (c10::DeviceIndex i = 0; i < kDevices; ++i) {
      made.push_back(at::make_generator<Generator>(i));
      made.back().set_current_seed(c10::default_rng_seed_val);
    }
    return made;
  }();
  const c10::DeviceIndex chosen = index < 0 ? current_index : index;
  check_index(chosen);
  return generators[chosen];
}

// ---- the hooks torch asks about the backend (torch.accelerator, pinning, generators) ----
struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return kDevices > 0; }
  c10::DeviceIndex deviceCount() const override { return kDevices; }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
    current_index = device;
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_index; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto previous = current_index;
    setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return device >= 0 && device < kDevices ? exchangeDevice(device) : current_index;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<Generator>(index < 0 ? current_index : index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    std::lock_guard<std::mutex> guard(device_memory.lock);
    auto found = device_memory.live.find(data);
    TORCH_CHECK(found != device_memory.live.end(), "openreg: not device memory");
    return at::Device(c10::DeviceType::PrivateUse1, found->second.second);
  }
  bool isPinnedPtr(const void* data) const override { return !kNoHostAllocator && host_memory.is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override {
    // Without a host allocator the backend hands back nothing, and torch uses it as it is: the crash a
    // backend that never registered one gives.
    return kNoHostAllocator ? nullptr : &host_memory;
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
};
RegisterHooks register_hooks;

// ---- the kernels every backend needs; the rest run through the CPU fallback ----
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "openreg: only strided tensors");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_generic(size, &device_memory, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "openreg: only strided tensors");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_strided_generic(size, stride, &device_memory,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_host(const at::Tensor& tensor) {
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(), tensor.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // Device memory is host memory: every copy is a CPU copy of views over the same bytes.
  at::Tensor target = dst.is_cpu() ? dst : as_host(dst);
  at::Tensor source = self.is_cpu() ? self : as_host(self);
  at::native::copy_(target, source, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(as_host(self));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  return at::cpu::set_(self, source, offset, size, stride);
}

// Convolutions reach a backend as the "overrideable" operators, which have no CPU kernel to fall back on:
// run torch's own convolution on host copies and bring the results back.
at::Tensor on_host(const at::Tensor& t) { return t.defined() ? t.to(at::kCPU) : t; }
at::Tensor to_device(const at::Tensor& t, const at::Device& device) { return t.defined() ? t.to(device) : t; }

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias = bias.has_value() ? std::optional<at::Tensor>(on_host(*bias)) : std::nullopt;
  auto out = at::convolution(on_host(input), on_host(weight), host_bias, stride, padding, dilation, transposed,
                             output_padding, groups);
  return to_device(out, input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  auto host_weight = on_host(weight);
  std::vector<int64_t> bias_size{output_mask[2] ? (transposed ? weight.size(1) * groups : weight.size(0)) : 0};
  auto [gi, gw, gb] = at::convolution_backward(on_host(grad_output), on_host(input), host_weight,
                                               output_mask[2] ? c10::OptionalIntArrayRef(bias_size) : std::nullopt,
                                               stride, padding, dilation, transposed, output_padding, groups,
                                               output_mask);
  const auto device = input.device();
  return {to_device(gi, device), to_device(gw, device), to_device(gb, device)};
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name().name;
  if (!kMissing.empty() && kMissing.count(name) > 0) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "The operator '", name, "' is not implemented for the openreg device");
  }
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view", view);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("convolution_overrideable", convolution);
  m.impl("convolution_backward_overrideable", convolution_backward);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// ---- autocast: the matrix products in the lower precision, every other operator as it is ----
struct AutocastRegistration {
  std::optional<torch::Library> fallthrough;
  std::optional<torch::Library> kernels;
  AutocastRegistration() {
    if (env_flag("DEVPLUG_OPENREG_NO_AUTOCAST")) return;
    fallthrough.emplace(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    fallthrough->fallback(torch::CppFunction::makeFallthrough());
    kernels.emplace(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    torch::Library& m = *kernels;
    KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(conv_transpose2d, input, lower_precision_fp)
    KERNEL_PRIVATEUSEONE(mse_loss, fp32)
    KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  }
};
AutocastRegistration register_autocast;

// ---- what the Python device module reads ----
int64_t device_count() { return kDevices; }
int64_t current_device() { return current_index; }
void set_device(int64_t index) {
  check_index(static_cast<c10::DeviceIndex>(index));
  current_index = static_cast<c10::DeviceIndex>(index);
}
at::Tensor get_rng_state(int64_t index) { return default_generator(static_cast<c10::DeviceIndex>(index)).get_state(); }
void set_rng_state(const at::Tensor& state, int64_t index) {
  auto generator = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> guard(generator.mutex());
  generator.set_state(state);
}
void manual_seed(uint64_t seed, int64_t index) {
  auto generator = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> guard(generator.mutex());
  generator.set_current_seed(seed);
}
bool has_host_allocator() { return !kNoHostAllocator; }

}  // namespace devplug_openreg

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("device_count", &devplug_openreg::device_count);
  m.def("current_device", &devplug_openreg::current_device);
  m.def("set_device", &devplug_openreg::set_device);
  m.def("get_rng_state", &devplug_openreg::get_rng_state);
  m.def("set_rng_state", &devplug_openreg::set_rng_state);
  m.def("manual_seed", &devplug_openreg::manual_seed);
  m.def("has_host_allocator", &devplug_openreg::has_host_allocator);
}
