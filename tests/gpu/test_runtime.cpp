// The CUDA runtime on a real device: copies and casts between and on devices
// (checked against the CPU's conversions, bit for bit), fill_ / add_ / mul_,
// pinned memory, streams and events, the caching allocator (reuse, the
// out-of-memory retry and error, stream safety) and the layer's counters.
#include <doctest/doctest.h>

#include <cstring>

#include <loom/core/cuda/caching_allocator.h>
#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>
#include "tests/gpu/compare.h"

using namespace loom;
using namespace loom::gpu_testing;

namespace {
// False under LOOM_CUDA_NO_CACHING=1 (compute-sanitizer's memcheck runs this
// suite so): no cache, so nothing of the cache to check.
bool allocator_caches() {
  if (cuda::CachingAllocator::caching_from_environment() == cuda::CachingAllocator::Caching::on) return true;
  MESSAGE("LOOM_CUDA_NO_CACHING=1: the allocator keeps no cache; its reuse is not checked");
  return false;
}
}  // namespace

TEST_SUITE("runtime") {

TEST_CASE("copies to the GPU and back are exact for every dtype") {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    const Tensor host = random_cpu({3, 5, 7}, 1, DType::f64, 0, 100).to(dtype);
    const Tensor device = host.to(kCuda);
    CHECK(device.device() == kCuda);
    check_close(device.to(Device::cpu()), host, 0, std::string("round trip ") + dtype_name(dtype));
  }
}

TEST_CASE("casts on the GPU equal the CPU's casts") {
  const DType all[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8};
  // Values that exercise rounding (ties, subnormal halves) and integer truncation.
  Tensor base = random_cpu({4097}, 2, DType::f64, -300, 300);
  {
    double* p = base.data<double>();
    p[0] = 1.0 + 1.0 / 2048;  // a tie in f16
    p[1] = 1e-6;              // an f16 subnormal
    p[2] = 65519.0;           // rounds to f16's largest finite value
    p[3] = -0.0;
  }
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor source = base.to(from);
    for (DType to : all) {
      if (to == DType::u8) continue;  // negative values: implementation-defined on both sides
      check_close(source.to(kCuda).to(to), source.to(to), 0,
                  std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to));
    }
  }
}

TEST_CASE("strided copies on the GPU: transposes, slices, permutes, views written through") {
  const Tensor host = random_cpu({4, 6, 5}, 3, DType::f32);
  const Tensor device = host.to(kCuda);
  check_close(device.transpose(0, 2).contiguous(), host.transpose(0, 2).contiguous(), 0, "transpose");
  check_close(device.slice(1, 1, 6, 2).contiguous(), host.slice(1, 1, 6, 2).contiguous(), 0, "slice step 2");
  check_close(device.permute({2, 0, 1}).contiguous(), host.permute({2, 0, 1}).contiguous(), 0, "permute");
  // Writing through a strided view of a GPU tensor.
  Tensor target = Tensor::zeros({4, 6, 5}, DType::f32, kCuda);
  Tensor expected = Tensor::zeros({4, 6, 5}, DType::f32);
  target.slice(1, 0, 6, 3).copy_(host.slice(1, 0, 6, 3));
  expected.slice(1, 0, 6, 3).copy_(host.slice(1, 0, 6, 3));
  check_close(target, expected, 0, "copy_ into a strided view from the CPU");
  // A strided CUDA source copied to the CPU, with a dtype change.
  check_close(device.transpose(0, 1).to(Device::cpu()).to(DType::f16), host.transpose(0, 1).to(DType::f16), 0,
              "strided GPU source to the CPU");
}

TEST_CASE("fill_, add_ and mul_ on GPU tensors") {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    Tensor device = Tensor::empty({5, 7}, dtype, kCuda);
    Tensor host = Tensor::empty({5, 7}, dtype);
    device.fill_(2.75);
    host.fill_(2.75);
    check_close(device, host, 0, std::string("fill_ ") + dtype_name(dtype));
    device.transpose(0, 1).slice(0, 0, 7, 2).fill_(-1.5);
    host.transpose(0, 1).slice(0, 0, 7, 2).fill_(-1.5);
    check_close(device, host, 0, std::string("strided fill_ ") + dtype_name(dtype));
    const Tensor other = random_cpu({5, 7}, 4, DType::f64, -10, 10).to(dtype);
    device.add_(other.to(kCuda), 0.5);
    host.add_(other, 0.5);
    check_close(device, host, dtype == DType::bf16 ? 1e-2 : 1e-3, std::string("add_ ") + dtype_name(dtype));
    device.mul_(-3.0);
    host.mul_(-3.0);
    check_close(device, host, dtype == DType::bf16 ? 1e-2 : 1e-3, std::string("mul_ ") + dtype_name(dtype));
  }
  // add_ converts the other tensor's dtype and device.
  Tensor sum = Tensor::ones({3}, DType::f32, kCuda);
  sum.add_(Tensor::from_vector<double>({1, 2, 3}, {3}));
  CHECK(sum.to_vector<float>() == std::vector<float>{2, 3, 4});
  CHECK(Tensor::full({}, 7.5, DType::f32, kCuda).item() == 7.5);
}

TEST_CASE("pinned memory: asynchronous copies to the GPU, reuse after the copy") {
  const size_t bytes = 1 << 20;
  void* block = cuda::allocate_pinned(bytes);
  CHECK(cuda::is_pinned(block));
  CHECK(cuda::is_pinned(static_cast<char*>(block) + bytes - 1));
  cuda::free_pinned(block);
  CHECK_FALSE(cuda::is_pinned(block));
  std::vector<float> ordinary(4);
  CHECK_FALSE(cuda::is_pinned(ordinary.data()));

  // A batch staged in pinned memory goes up without blocking the host; the
  // staging buffer may be rewritten once the copy has been waited for.
  const Tensor values = random_cpu({256, 1024}, 5, DType::f32);
  Tensor staged = Tensor::empty_pinned({256, 1024}, DType::f32);
  CHECK(cuda::is_pinned(staged.raw_data()));
  staged.copy_(values);
  const Tensor device = staged.to(kCuda);
  cuda::current_stream(0).synchronize();
  staged.fill_(0);
  check_close(device.to(Device::cpu()), values, 0, "pinned upload");
  // A freed pinned block is handed out again once its copies are done.
  void* first = staged.raw_data();
  staged = Tensor();
  Tensor again = Tensor::empty_pinned({256, 1024}, DType::f32);
  CHECK(again.raw_data() == first);
}

TEST_CASE("streams and events order work between streams") {
  cuda::Stream side(0);
  cuda::Event produced(0), timing_start(0, cuda::EventTiming::enabled), timing_end(0, cuda::EventTiming::enabled);
  const Tensor host = random_cpu({1 << 20}, 6, DType::f32);
  Tensor a = host.to(kCuda);  // copied on the default stream
  cuda::Event uploaded(0);
  uploaded.record(cuda::current_stream(0));
  Tensor b;
  {
    cuda::StreamGuard guard(side);
    CHECK(cuda::current_stream(0).handle() == side.handle());
    side.wait(uploaded);
    timing_start.record(side);
    b = scale(a, 2.0);  // runs on the side stream
    produced.record(side);
    timing_end.record(side);
  }
  CHECK(cuda::current_stream(0).is_default());
  cuda::current_stream(0).wait(produced);  // the default stream consumes b after the side stream made it
  check_close(b.to(Device::cpu()), scale(host, 2.0), 0, "result made on a side stream");
  produced.synchronize();
  CHECK(produced.query());
  CHECK(side.query());
  CHECK(timing_start.elapsed_ms(timing_end) >= 0.0f);
  // Moves keep one owner.
  cuda::Stream moved = std::move(side);
  CHECK(moved.handle() != nullptr);
  CHECK(side.handle() == nullptr);
  cuda::Stream high(0, cuda::StreamPriority::high);
  high.synchronize();
}

TEST_CASE("the caching allocator reuses freed memory and counts it") {
  if (!allocator_caches()) return;
  cuda::synchronize(0);
  const cuda::MemoryStats before = cuda::memory_stats(0);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, kCuda);  // 4 MiB
    first = t.raw_data();
    CHECK(cuda::memory_stats(0).allocated_bytes >= before.allocated_bytes + (4u << 20));
  }
  Tensor again = Tensor::empty({1 << 20}, DType::f32, kCuda);
  CHECK(again.raw_data() == first);
  const cuda::MemoryStats after = cuda::memory_stats(0);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(after.peak_allocated_bytes >= after.allocated_bytes);
  CHECK(after.reserved_bytes >= after.allocated_bytes);
  MESSAGE(cuda::memory_summary(0));
}

TEST_CASE("out of memory: a huge request fails with the counters in the message; cached memory is released and retried") {
  cuda::synchronize(0);
  const cuda::MemoryStats before = cuda::memory_stats(0);
  // Far beyond any GPU: fails even after the retry.
  check_mentions(error_message([] { Tensor huge = Tensor::empty({int64_t{1} << 40}, DType::f32, kCuda); }),  // 4 TiB
                 {"CUDA out of memory on cuda:0: tried to allocate 4096.00 GiB", "loom tensors hold", "the device has"});
  const cuda::MemoryStats after = cuda::memory_stats(0);
  CHECK(after.ooms == before.ooms + 1);
  CHECK(after.oom_retries == before.oom_retries + 1);
  // The allocator still serves requests.
  Tensor small = Tensor::ones({10}, DType::f32, kCuda);
  CHECK(small.to_vector<float>()[9] == 1.0f);

  // Cache a large free block, then ask for more than fits beside it: the
  // retry must release the cache and succeed.
  if (!allocator_caches()) return;
  cuda::empty_cache(0);
  const size_t free_bytes = cuda::device_memory(0).free_bytes;
  REQUIRE(free_bytes > (size_t{1} << 30));
  const int64_t first_elements = static_cast<int64_t>(static_cast<double>(free_bytes) * 0.55) / 4;
  const int64_t second_elements = static_cast<int64_t>(static_cast<double>(free_bytes) * 0.60) / 4;
  { Tensor cached = Tensor::empty({first_elements}, DType::f32, kCuda); }  // freed into the cache
  CHECK(cuda::memory_stats(0).reserved_bytes >= static_cast<size_t>(first_elements) * 4);
  const int64_t retries = cuda::memory_stats(0).oom_retries;
  Tensor second = Tensor::empty({second_elements}, DType::f32, kCuda);
  CHECK(cuda::memory_stats(0).oom_retries == retries + 1);
  second = Tensor();
  cuda::empty_cache(0);
}

TEST_CASE("memory freed while another stream still reads it is not reused before that stream is done") {
  cuda::Stream reader(0);
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor source = Tensor::full({n}, 1.0, DType::f32, kCuda);
  void* source_memory = source.storage()->data();
  cuda::Event ready(0);
  ready.record(cuda::current_stream(0));
  Tensor copies;
  {
    cuda::StreamGuard guard(reader);
    reader.wait(ready);
    for (int i = 0; i < 20; ++i) copies = source.clone();  // keeps the reader busy for a while
  }
  cuda::record_stream(source_memory, 0, reader);
  source = Tensor();  // freed while the reader may still be copying
  Tensor fresh = Tensor::full({n}, 2.0, DType::f32, kCuda);
  const bool reader_done = reader.query();
  INFO("reader finished before the new allocation was checked: ", reader_done);
  CHECK((fresh.storage()->data() != source_memory || reader_done));
  reader.synchronize();
  {
    cuda::StreamGuard guard(reader);
    CHECK(sum(copies).item() == doctest::Approx(static_cast<double>(n)));
  }
}

TEST_CASE("library errors name the call, the file and line, and the device") {
  const std::string message = error_message([] {
    cuda::Event untimed(0);  // created without timing: elapsed_ms must fail in the CUDA runtime
    untimed.record(cuda::current_stream(0));
    untimed.synchronize();
    (void)untimed.elapsed_ms(untimed);
  });
  check_mentions(message, {"cudaEventElapsedTime", "core/cuda/runtime.cpp:", "on cuda:0", "CUDA error"});
}

TEST_CASE("the CUDA layer counts its launches, library calls, copies and host waits, each once") {
  // What one call adds to cuda::counters(), the other fields unchanged.
  const auto delta = [](auto&& call) {
    const cuda::Counters before = cuda::counters();
    call();
    return cuda::counters() - before;
  };
  const auto only = [](int64_t cuda::Counters::*field, int64_t n) {
    cuda::Counters c;
    c.*field = n;
    return c;
  };
  Tensor a = random_cpu({256}, 11, DType::f32).to(kCuda);
  cuda::synchronize(0);
  CHECK(delta([&] { a.fill_(3.0); }) == only(&cuda::Counters::kernel_launches, 1));
  Tensor b = Tensor::empty({256}, DType::f32, kCuda);
  CHECK(delta([&] { b.copy_(a); }) == only(&cuda::Counters::device_copies, 1));  // a cudaMemcpyAsync, no kernel
  cuda::Counters to_host;
  to_host.device_copies = 1;
  to_host.device_to_host_copies = 1;
  Tensor host;
  CHECK(delta([&] { host = b.to(Device::cpu()); }) == to_host);
  CHECK(host.data<float>()[255] == 3.0f);
  CHECK(delta([] { cuda::synchronize(0); }) == only(&cuda::Counters::device_synchronizes, 1));
  CHECK(delta([] { cuda::current_stream(0).synchronize(); }) == only(&cuda::Counters::stream_synchronizes, 1));
  cuda::Event done(0);
  done.record(cuda::current_stream(0));
  CHECK(delta([&] { done.synchronize(); }) == only(&cuda::Counters::event_synchronizes, 1));
  const Tensor x = random_cpu({4, 8}, 12, DType::f32).to(kCuda), w = random_cpu({3, 8}, 13, DType::f32).to(kCuda);
  CHECK(delta([&] { (void)linear(x, w); }) == only(&cuda::Counters::library_calls, 1));  // one cublasGemmEx
  cuda::reset_counters();
  CHECK(cuda::counters() == cuda::Counters{});
}

TEST_CASE("local_rank_device follows LOCAL_RANK") {
  setenv("LOCAL_RANK", "0", 1);
  CHECK(cuda::local_rank_device() == 0);
  setenv("LOCAL_RANK", "x", 1);
  CHECK_THROWS_AS(cuda::local_rank_device(), Error);
  unsetenv("LOCAL_RANK");
  CHECK(cuda::local_rank_device() == 0);
}

}  // TEST_SUITE
