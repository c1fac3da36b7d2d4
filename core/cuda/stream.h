// CUDA streams and events as loom sees them: move-only owners (Stream, Event),
// a copyable non-owning StreamView, each thread's current stream per device,
// and scope guards. No CUDA headers: the handles are the runtime's own opaque
// pointer types (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*), so
// a .cu file passes view.handle() straight to a kernel launch or a library.
//
// A build without CUDA has the same classes; constructing a Stream or Event
// throws "loom was built without CUDA".
#pragma once

#include <utility>

struct CUstream_st;
struct CUevent_st;

namespace loom::cuda {

using StreamHandle = CUstream_st*;  // cudaStream_t
using EventHandle = CUevent_st*;    // cudaEvent_t

class Event;

namespace detail {
// Release a handle; never throw (errors are ignored: the driver may be shutting down).
void release_stream(StreamHandle handle) noexcept;
void release_event(EventHandle handle) noexcept;
}  // namespace detail

// The owner of one handle of a device (a stream, an event, a cuBLAS or cuDNN
// handle): move-only, a moved-from owner holds none, and the destructor
// releases the handle with `release`. A derived class's constructor creates
// handle_ on device_.
template <class Handle, void (*release)(Handle) noexcept>
class DeviceHandleOwner {
 public:
  ~DeviceHandleOwner() {
    if (handle_ != nullptr) release(handle_);
  }
  DeviceHandleOwner(DeviceHandleOwner&& other) noexcept
      : device_(std::exchange(other.device_, -1)), handle_(std::exchange(other.handle_, nullptr)) {}
  DeviceHandleOwner& operator=(DeviceHandleOwner&& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(handle_, other.handle_);
    return *this;
  }
  DeviceHandleOwner(const DeviceHandleOwner&) = delete;  // one owner per handle
  DeviceHandleOwner& operator=(const DeviceHandleOwner&) = delete;

  int device() const { return device_; }
  Handle handle() const { return handle_; }

 protected:
  explicit DeviceHandleOwner(int device) : device_(device) {}
  int device_ = -1;
  Handle handle_ = nullptr;
};

// A stream of one device, not owned: the device's default stream (handle
// nullptr) or a stream that a Stream object owns and keeps alive.
class StreamView {
 public:
  StreamView() = default;
  StreamView(int device, StreamHandle handle) : device_(device), handle_(handle) {}

  int device() const { return device_; }
  StreamHandle handle() const { return handle_; }
  bool is_default() const { return handle_ == nullptr; }

  // Blocks the host until the work queued so far has finished. Not for hot paths.
  void synchronize() const;
  // True when the work queued so far has finished; never blocks.
  [[nodiscard]] bool query() const;
  // Work queued on this stream from now on starts after `event`'s captured work.
  void wait(const Event& event) const;

  bool operator==(const StreamView&) const = default;

 private:
  int device_ = 0;
  StreamHandle handle_ = nullptr;
};

enum class StreamPriority { normal, high };

// An owned stream. It does not synchronise implicitly with the default stream
// (cudaStreamNonBlocking): order it with events.
class Stream : public DeviceHandleOwner<StreamHandle, detail::release_stream> {
 public:
  explicit Stream(int device, StreamPriority priority = StreamPriority::normal);

  StreamView view() const { return {device_, handle_}; }
  operator StreamView() const { return view(); }  // NOLINT: a Stream is usable wherever a view is
  void synchronize() const { view().synchronize(); }
  [[nodiscard]] bool query() const { return view().query(); }
  void wait(const Event& event) const { view().wait(event); }
};

enum class EventTiming { disabled, enabled };

// An owned event. record() captures the work queued on a stream so far;
// query() / synchronize() / StreamView::wait() refer to that capture. An event
// never recorded counts as complete.
class Event : public DeviceHandleOwner<EventHandle, detail::release_event> {
 public:
  explicit Event(int device, EventTiming timing = EventTiming::disabled);

  // `stream` must be on this event's device.
  void record(StreamView stream);
  [[nodiscard]] bool query() const;
  void synchronize() const;
  // Milliseconds from this event to `later`; both recorded, with timing enabled.
  float elapsed_ms(const Event& later) const;
};

// The stream that loom's work on `device` goes to from the calling thread:
// the default stream unless set_current_stream() or a StreamGuard chose another.
StreamView current_stream(int device);
// Makes `stream` the calling thread's current stream of stream.device().
void set_current_stream(StreamView stream);

// A stream of `device` from a pool that lives until the process exits: for
// library code's side streams (a process group's, a data loader's copies).
// Memory used on a stream is recorded by its handle (record_stream) and freed
// after an event on it, so such streams must outlive every tensor that
// touched them -- an owned Stream destroyed earlier would leave the caching
// allocator a dead (or recycled) handle. Handed out round-robin, kPooledStreams
// per device and priority, created on first use.
constexpr int kPooledStreams = 4;
StreamView pooled_stream(int device, StreamPriority priority = StreamPriority::normal);

// Makes `stream` current for its device for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(StreamView stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamView previous_;
};

// Makes `device` the calling thread's CUDA device (cudaSetDevice) for the
// guard's lifetime; the previous device is restored after -- unless the
// thread was still on CUDA's implicit device 0 (no set_device, no guard that
// changed its device before): restoring that would create a context on GPU 0,
// hundreds of MiB there for every rank of a multi-GPU node (what PyTorch's
// MaybeSetDevice avoids), so such a thread keeps the guard's device as its own.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace loom::cuda
