// The CUDA runtime as the rest of loom sees it: devices, device memory (the
// caching allocator), pinned host memory, copies and backend settings. No
// CUDA headers, so any translation unit may include it.
//
// A build without CUDA has the same functions: device_count() is 0 and the
// rest throws the one-line "loom was built without CUDA" error. A build with
// CUDA on a machine without a GPU sees zero devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <loom/core/cuda/stream.h>

namespace loom::cuda {

// ---- devices ----

// True when this binary contains the CUDA backend.
bool built_with_cuda();
// Number of visible CUDA devices; 0 without a GPU, a driver, or CUDA support.
int device_count();
// Why device_count() is 0 when the CUDA runtime said so by an error
// (cudaGetDeviceCount's message, e.g. a driver older than the runtime); empty otherwise.
std::string device_count_error();
// Throws a one-line loom::Error unless device `index` can be used, saying why
// ("loom was built without CUDA", "no CUDA device is visible", ...).
void require_device(int index);
// The one-line error require_device throws for device `index` when `count`
// devices are visible, "" when it is one of them: "cuda:3 requested but only
// 1 CUDA device is visible (CUDA_VISIBLE_DEVICES=0); the one visible is
// cuda:0". `visible_devices`: CUDA_VISIBLE_DEVICES, null when unset.
std::string device_ordinal_error(int index, int count, const char* visible_devices);
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)".
std::string device_name(int index);
// The compute capability as major * 10 + minor (90 for sm_90).
int compute_capability(int index);
// The theoretical DRAM bandwidth in GB/s (10^9 bytes): the peak memory clock
// times the bus width, twice per clock (DDR); 0 when the driver reports
// neither. What memory-bound benchmarks report their GB/s against.
double peak_memory_bandwidth_gbs(int index);
// The calling thread's current device (cudaGetDevice / cudaSetDevice).
int current_device();
void set_device(int index);
// The device one process of a multi-GPU launch drives: its local rank
// (LOCAL_RANK from torchrun / loomrun, else SLURM_LOCALID, else
// OMPI_COMM_WORLD_LOCAL_RANK) modulo device_count(); 0 when none is set.
// Throws when no device is visible.
int local_rank_device();
// Free and total memory of the device as the driver reports them.
struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
};
DeviceMemory device_memory(int index);
// Blocks the host until all work on the device is done. Tests and benchmarks
// only: never on a training step's path.
void synchronize(int device);
// Bracket the work that an attached CUDA profiler records when told to wait
// for them (ncu --profile-from-start off, nsys --capture-range=cudaProfilerApi);
// without a profiler they do nothing. Benchmarks only.
void profiler_start();
void profiler_stop();

// ---- device memory (the caching allocator, core/cuda/caching_allocator.h) ----

// Counters of one device's allocator, in bytes unless named otherwise.
struct MemoryStats {
  size_t allocated_bytes = 0;       // held by live allocations (rounded sizes)
  size_t reserved_bytes = 0;        // obtained from the device (segments)
  size_t peak_allocated_bytes = 0;  // since start or reset_peak_memory_stats
  size_t peak_reserved_bytes = 0;
  size_t requested_bytes = 0;       // held by live allocations, as requested
  int64_t allocations = 0;          // live allocations
  int64_t segments = 0;             // live device allocations (cudaMalloc)
  int64_t device_allocs = 0;        // cudaMalloc calls, total
  int64_t device_frees = 0;         // cudaFree calls, total
  int64_t cache_hits = 0;           // requests served without cudaMalloc
  int64_t oom_retries = 0;          // out of memory: cache released and retried
  int64_t ooms = 0;                 // out-of-memory errors thrown
};

// `nbytes` on `device` for work on the calling thread's current stream of
// that device; nullptr for 0 bytes. Throws loom::Error when out of memory.
void* allocate(size_t nbytes, int device);
// Gives back memory from allocate(); never throws.
void deallocate(void* ptr, int device) noexcept;
// Marks that work queued on `stream` (other than the allocating stream) uses
// the allocation `ptr`: its memory is reused only after that work is done.
void record_stream(void* ptr, int device, StreamView stream);
MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);
// Returns cached, unused memory to the device.
void empty_cache(int device);
// A CUDA graph's private memory pool on `device` (CachingAllocator's
// begin_private_pool / end_private_pool / release_private_pool): cuda::Graph.
void begin_private_pool(int device, uint64_t pool, StreamView stream);
void end_private_pool(int device, StreamView stream);
void release_private_pool(int device, uint64_t pool) noexcept;
// One line: "cuda:0 allocated 12.0 MiB (peak 40.1 MiB), reserved 64.0 MiB (peak 64.0 MiB), ...".
std::string memory_summary(int device);

// Scratch device memory (workspaces) from the caching allocator, owned.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t nbytes, int device) : data_(allocate(nbytes, device)), nbytes_(nbytes), device_(device) {}
  ~DeviceBuffer() { deallocate(data_, device_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return nbytes_; }

 private:
  void swap(DeviceBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(nbytes_, other.nbytes_);
    std::swap(device_, other.device_);
  }
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  int device_ = 0;
};

// ---- pinned (page-locked) host memory, for staging copies ----

// Page-locked host memory (cached: freed blocks are reused by later requests
// of the same rounded size). Throws loom::Error without CUDA or a device.
void* allocate_pinned(size_t nbytes);
// Gives back memory from allocate_pinned(); the block is reused only after the
// copies recorded with record_pinned_use() have completed. Never throws.
void free_pinned(void* ptr) noexcept;
// True when ptr lies inside a live pinned block.
bool is_pinned(const void* ptr);
// Marks that work queued on `stream` reads or writes the pinned block holding ptr.
void record_pinned_use(const void* ptr, StreamView stream);

// ---- copies ----

// Synchronous copy between host and device memory of `device` (either side
// may be the device).
void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes, int device);
// Enqueues the copy on `stream` and returns. Pageable host memory is staged by
// the driver before return (the source may then be reused); pinned host memory
// and device memory must stay valid until the stream reaches the copy.
void copy_bytes_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes,
                      StreamView stream);
// Copies between two devices' memory on `stream` (of dst_device), ordered
// after the work queued so far on src_device's current stream.
void copy_between_devices(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                          StreamView stream);

// ---- settings ----

// TF32 tensor-core math for f32 matrix products and convolutions: faster,
// about 1e-3 relative error. Off by default.
void set_allow_tf32(bool allow);
bool allow_tf32();
// How cuDNN convolution algorithms are chosen, once per shape: benchmark
// (cudnnFind: times the candidates; the default) or heuristic (cudnnGet).
// The environment variable LOOM_CUDNN_SEARCH=heuristic|benchmark sets the default.
enum class ConvAlgorithmSearch { benchmark, heuristic };
void set_conv_algorithm_search(ConvAlgorithmSearch search);
ConvAlgorithmSearch conv_algorithm_search();

}  // namespace loom::cuda
