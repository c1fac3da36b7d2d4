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

CublasHandle::CublasHandle(int device) : DeviceHandleOwner(device) {
  DeviceGuard guard(device);
  LOOM_CHECK_CUBLAS(cublasCreate(&handle_));
}

CudnnHandle::CudnnHandle(int device) : DeviceHandleOwner(device) {
  DeviceGuard guard(device);
  LOOM_CHECK_CUDNN(cudnnCreate(&handle_));
}

namespace detail {
void release_cublas(CublasHandleType handle) noexcept { cublasDestroy(handle); }
void release_cudnn(CudnnHandleType handle) noexcept { cudnnDestroy(handle); }
}  // namespace detail

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

// The calling thread's handle of Owner's library for stream.device(), bound to
// `stream` by set_stream(handle, stream) when it was fresh or bound to another.
template <class Owner, class SetStream>
auto borrowed_handle(StreamView stream, SetStream&& set_stream) {
  thread_local Borrowed<Owner> borrowed;
  require_device(stream.device());
  bool fresh = false;
  auto& slot = borrowed.slot(stream.device(), fresh);
  if (fresh || slot.stream != stream.handle()) {
    set_stream(slot.owner->handle(), stream.handle());
    slot.stream = stream.handle();
  }
  return slot.owner->handle();
}
}  // namespace

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

CublasHandleType cublas_handle(StreamView stream) {
  return borrowed_handle<CublasHandle>(stream, [](CublasHandleType handle, StreamHandle bound) {
    LOOM_CHECK_CUBLAS(cublasSetStream(handle, bound));
  });
}

CudnnHandleType cudnn_handle(StreamView stream) {
  return borrowed_handle<CudnnHandle>(stream, [](CudnnHandleType handle, StreamHandle bound) {
    LOOM_CHECK_CUDNN(cudnnSetStream(handle, bound));
  });
}

}  // namespace loom::cuda
