// cuBLAS and cuDNN handles (handles.h): owners, per-device pools, and the
// handle each thread borrows.
#include <loom/core/cuda/handles.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/cuda/check.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>

namespace loom::cuda {

CublasHandle::CublasHandle(int device) : device_(device) {
  DeviceGuard guard(device);
  LOOM_CHECK_CUBLAS(cublasCreate(&handle_));
}
CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);  // errors ignored
}
CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : device_(std::exchange(other.device_, -1)), handle_(std::exchange(other.handle_, nullptr)) {}
CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(handle_, other.handle_);
  return *this;
}

CudnnHandle::CudnnHandle(int device) : device_(device) {
  DeviceGuard guard(device);
  LOOM_CHECK_CUDNN(cudnnCreate(&handle_));
}
CudnnHandle::~CudnnHandle() {
  if (handle_ != nullptr) cudnnDestroy(handle_);  // errors ignored
}
CudnnHandle::CudnnHandle(CudnnHandle&& other) noexcept
    : device_(std::exchange(other.device_, -1)), handle_(std::exchange(other.handle_, nullptr)) {}
CudnnHandle& CudnnHandle::operator=(CudnnHandle&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(handle_, other.handle_);
  return *this;
}

namespace {
constexpr int kMaxDevices = 64;

// The handles of one device: all ever created (owned) and those not lent out.
template <class Owner>
class HandlePool {
 public:
  Owner* acquire(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      Owner* owner = idle_.back();
      idle_.pop_back();
      return owner;
    }
    all_.push_back(std::make_unique<Owner>(device));
    return all_.back().get();
  }
  void release(Owner* owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(owner);
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Owner>> all_;
  std::vector<Owner*> idle_;
};

// Pools are never destroyed (see handles.h).
template <class Owner>
HandlePool<Owner>& pool(int device) {
  static auto* pools = new std::array<HandlePool<Owner>, kMaxDevices>;
  LOOM_CHECK(device >= 0 && device < kMaxDevices, "CUDA device ", device, " is out of range");
  return (*pools)[device];
}

// The handles one thread has borrowed, per device, with the stream each is bound to.
template <class Owner>
struct Borrowed {
  struct Slot {
    Owner* owner = nullptr;
    StreamHandle stream = nullptr;
  };
  std::vector<Slot> slots;
  ~Borrowed() {
    for (size_t device = 0; device < slots.size(); ++device) {
      if (slots[device].owner != nullptr) pool<Owner>(static_cast<int>(device)).release(slots[device].owner);
    }
  }
  // The slot of `device`, its handle created or borrowed on first use.
  Slot& slot(int device, bool& fresh) {
    if (static_cast<int>(slots.size()) <= device) slots.resize(device + 1);
    Slot& s = slots[device];
    fresh = s.owner == nullptr;
    if (fresh) s.owner = pool<Owner>(device).acquire(device);
    return s;
  }
};
}  // namespace

CublasHandleType cublas_handle(StreamView stream) {
  thread_local Borrowed<CublasHandle> borrowed;
  require_device(stream.device());
  bool fresh = false;
  auto& slot = borrowed.slot(stream.device(), fresh);
  if (fresh || slot.stream != stream.handle()) {
    LOOM_CHECK_CUBLAS(cublasSetStream(slot.owner->get(), stream.handle()));
    slot.stream = stream.handle();
  }
  return slot.owner->get();
}

namespace detail {
const char* cudnn_error_text(int status) {
  thread_local std::string text;
  text = cudnnGetErrorString(static_cast<cudnnStatus_t>(status));
#if CUDNN_MAJOR >= 9
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string(": ") + detail;
#endif
  return text.c_str();
}
}  // namespace detail

CudnnHandleType cudnn_handle(StreamView stream) {
  thread_local Borrowed<CudnnHandle> borrowed;
  require_device(stream.device());
  bool fresh = false;
  auto& slot = borrowed.slot(stream.device(), fresh);
  if (fresh || slot.stream != stream.handle()) {
    LOOM_CHECK_CUDNN(cudnnSetStream(slot.owner->get(), stream.handle()));
    slot.stream = stream.handle();
  }
  return slot.owner->get();
}

}  // namespace loom::cuda
