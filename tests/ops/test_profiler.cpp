// The per-op profiler: time per (op, input shape), and the operations counted
// by conv2d and linear, so --profile can print GFLOP/s per layer; its Chrome
// trace, read back with nlohmann::json.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <loom/core/error.h>
#include <loom/core/profiler.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>

using namespace loom;

namespace {
// The report's per-op line for `op` ("all layers: conv2d   113.12 ms ..."):
// the name, padding, then the time, whatever its width.
bool has_all_layers_row(const std::string& report, const std::string& op) {
  const std::string prefix = "all layers: " + op + " ";
  for (size_t at = report.find(prefix); at != std::string::npos; at = report.find(prefix, at + 1)) {
    size_t first = report.find_first_not_of(' ', at + prefix.size());
    if (first != std::string::npos && std::isdigit(static_cast<unsigned char>(report[first]))) return true;
  }
  return false;
}

struct TraceFile {
  std::filesystem::path path;
  TraceFile() {
    char name[] = "/tmp/loom_trace_XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd >= 0) ::close(fd);
    path = name;
  }
  ~TraceFile() { std::filesystem::remove(path); }
  nlohmann::json read() const {
    std::ifstream in(path);
    return nlohmann::json::parse(in);  // throws on anything that is not JSON
  }
};

// The events named `name` (not the metadata).
std::vector<nlohmann::json> events_named(const nlohmann::json& trace, const std::string& name) {
  std::vector<nlohmann::json> found;
  for (const auto& event : trace["traceEvents"])
    if (event["ph"] != "M" && event["name"] == name) found.push_back(event);
  return found;
}
}  // namespace

TEST_CASE("profiler counts conv2d and linear operations per layer, forward and backward") {
  profiler::reset();
  profiler::set_enabled(true);
  {
    profiler::Scope step("step (all)");
    // 64 images, 64 -> 64 channels, 3x3, 16x16 output: 2 * 64*64*576*256 = 1.208 GFLOP per GEMM;
    // the input needs no gradient, so backward runs only the weight's GEMM.
    Tensor w = Tensor::zeros({64, 64, 3, 3}).set_requires_grad(true);
    Tensor y = conv2d(Tensor::zeros({64, 64, 16, 16}), w, Tensor(), {.padding = {1, 1}});
    // 64 x 16384 -> 128: 2 * 64*16384*128 = 0.268 GFLOP per GEMM; backward: input and weight.
    Tensor fc = Tensor::zeros({128, 16384}).set_requires_grad(true);
    sum(linear(y.reshape({64, 16384}), fc, Tensor())).backward();
  }
  profiler::set_enabled(false);
  const std::string report = profiler::report();
  INFO(report);
  CHECK(report.find("GFLOP/s  op [input shape]") != std::string::npos);
  CHECK(has_all_layers_row(report, "conv2d"));
  CHECK(has_all_layers_row(report, "conv2d backward"));
  CHECK(report.find("    1.208 GFLOP") != std::string::npos);  // conv2d forward, and its backward
  CHECK(report.find("    0.268 GFLOP") != std::string::npos);  // linear forward
  CHECK(report.find("    0.537 GFLOP") != std::string::npos);  // linear backward
  profiler::reset();
}

TEST_CASE("the Chrome trace holds ops, events timed elsewhere and thread names as Trace Event Format JSON") {
  TraceFile file;
  profiler::start_tracing();
  profiler::set_process_name("trace test");
  {
    Tensor w = Tensor::zeros({4, 3, 3, 3}).set_requires_grad(true);
    sum(conv2d(Tensor::zeros({2, 3, 8, 8}), w, Tensor(), {.padding = {1, 1}})).backward();
  }
  // A helper thread: named, with a Range of its own.
  int helper_thread = 0;
  std::thread helper([&] {
    profiler::set_thread_name("helper \"one\"");
    helper_thread = profiler::current_thread_id();
    profiler::Range wait("data wait", "data");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  helper.join();
  // Timed by the caller: a span of exactly 1500 us and an instant, on the helper's track.
  const profiler::Clock::time_point start = profiler::Clock::now();
  profiler::record_complete("bucket 0 reduce", "ddp", start, start + std::chrono::microseconds(1500), helper_thread,
                            "\"bytes\": 4096");
  profiler::record_instant("bucket 0 ready", "ddp", start, profiler::current_thread_id());
  profiler::stop_tracing();
  { profiler::Scope after("after stop"); }  // not kept
  profiler::write_chrome_trace(file.path.string());

  const nlohmann::json trace = file.read();
  CHECK(trace["otherData"]["dropped_events"] == 0);
  CHECK(!trace["otherData"].contains("note"));
  const int pid = static_cast<int>(::getpid());
  std::map<int, std::string> thread_names;
  std::string process_name;
  for (const auto& event : trace["traceEvents"]) {
    REQUIRE(event.contains("ph"));
    CHECK(event["pid"] == pid);
    if (event["ph"] == "M" && event["name"] == "thread_name") thread_names[event["tid"]] = event["args"]["name"];
    if (event["ph"] == "M" && event["name"] == "process_name") process_name = event["args"]["name"];
    if (event["ph"] == "X") CHECK(event["dur"].get<double>() >= 0);
  }
  CHECK(process_name == "trace test");
  CHECK(thread_names[helper_thread] == "helper \"one\"");
  CHECK(thread_names[profiler::current_thread_id()] != "");

  const auto convs = events_named(trace, "conv2d");
  REQUIRE(convs.size() == 1);
  CHECK(convs[0]["ph"] == "X");
  CHECK(convs[0]["cat"] == "op");
  CHECK(convs[0]["tid"] == profiler::current_thread_id());
  CHECK(convs[0]["args"]["shape"] == "[2, 3, 8, 8]");
  CHECK(convs[0]["args"]["flops"].get<double>() > 0);
  CHECK(events_named(trace, "conv2d backward").size() == 1);

  const auto waits = events_named(trace, "data wait");
  REQUIRE(waits.size() == 1);
  CHECK(waits[0]["cat"] == "data");
  CHECK(waits[0]["tid"] == helper_thread);
  CHECK(waits[0]["dur"].get<double>() >= 2000.0);  // microseconds

  const auto reduces = events_named(trace, "bucket 0 reduce");
  REQUIRE(reduces.size() == 1);
  CHECK(reduces[0]["tid"] == helper_thread);
  CHECK(reduces[0]["dur"].get<double>() == doctest::Approx(1500.0));
  CHECK(reduces[0]["args"]["bytes"] == 4096);
  const double start_us =
      std::chrono::duration<double, std::micro>(start.time_since_epoch()).count();
  CHECK(reduces[0]["ts"].get<double>() == doctest::Approx(start_us).epsilon(1e-12));
  const auto readies = events_named(trace, "bucket 0 ready");
  REQUIRE(readies.size() == 1);
  CHECK(readies[0]["ph"] == "i");
  CHECK(readies[0]["ts"] == reduces[0]["ts"]);
  CHECK(events_named(trace, "after stop").empty());
}

TEST_CASE("the trace keeps at most its cap of events and says how many it dropped") {
  TraceFile file;
  profiler::start_tracing(3);
  const profiler::Clock::time_point now = profiler::Clock::now();
  for (int i = 0; i < 10; ++i) profiler::record_instant(str("event ", i), "test", now, profiler::current_thread_id());
  profiler::stop_tracing();
  profiler::write_chrome_trace(file.path.string());
  const nlohmann::json trace = file.read();
  CHECK(trace["otherData"]["event_cap"] == 3);
  CHECK(trace["otherData"]["dropped_events"] == 7);
  CHECK(trace["otherData"]["note"].get<std::string>().find("7 later events were dropped") != std::string::npos);
  CHECK(events_named(trace, "event 2").size() == 1);
  CHECK(events_named(trace, "event 3").empty());
  CHECK(events_named(trace, "trace event cap reached: later events were dropped").size() == 1);

  CHECK_THROWS_WITH_AS(profiler::write_chrome_trace("/proc/loom-no-such-directory/trace.json"),
                       doctest::Contains("cannot write the trace file /proc/loom-no-such-directory/trace.json"), Error);
}
