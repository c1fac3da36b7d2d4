// Checkpoints: the safetensors bytes against the format's definition, round
// trips of every dtype and of a training state, atomic replacement, model
// mismatches reported by name, and malformed files (truncated, bad header
// length, invalid JSON, bad dtypes, offsets out of range or overlapping)
// rejected with a loom::Error naming the file.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include <loom/core/generator.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include "tests/models/helpers.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Little-endian bytes of a value, written out by hand.
template <class T>
std::string le_bytes(T value) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

nn::NamedTensors every_dtype() {
  return {
      {"f32", Tensor::from_vector_as({1.5, -2.0, 3.25, 0.0, 7.0, -0.5}, {2, 3}, DType::f32)},
      {"f64", Tensor::from_vector_as({0.1, 1e-300}, {2}, DType::f64)},
      {"f16", Tensor::from_vector_as({1.5, -2.0, 65504.0}, {3}, DType::f16)},
      {"bf16", Tensor::from_vector_as({1.5, -3.0}, {1, 2}, DType::bf16)},
      {"i64", Tensor::from_vector_as({-2.0, 9007199254740993.0 - 1}, {2}, DType::i64)},
      {"i32", Tensor::from_vector_as({-7.0, 8.0, 9.0}, {3, 1}, DType::i32)},
      {"u8", Tensor::from_vector_as({0.0, 255.0}, {2}, DType::u8)},
      {"scalar", Tensor::full({}, 42, DType::i64)},
      {"empty", Tensor::zeros({0, 4})},
      {"transposed", Tensor::from_vector_as({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32).transpose(0, 1)},
  };
}

void check_equal(const nn::NamedTensors& actual, const nn::NamedTensors& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("tensor ", expected[i].first);
    CHECK(actual[i].first == expected[i].first);
    CHECK(actual[i].second.dtype() == expected[i].second.dtype());
    CHECK(actual[i].second.sizes() == expected[i].second.sizes());
    CHECK(actual[i].second.to_vector<double>() == expected[i].second.to_vector<double>());
  }
}

// A small ResNet after one SGD step (so momentum buffers and BN statistics exist).
struct Trained {
  std::shared_ptr<nn::ResNet> model;
  std::unique_ptr<optim::SGD> optimizer;
  std::unique_ptr<optim::CosineAnnealingLR> scheduler;
};
Trained trained_resnet(uint64_t seed) {
  manual_seed(seed);
  Trained t;
  t.model = nn::resnet18(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(4));
  t.optimizer = std::make_unique<optim::SGD>(t.model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  t.scheduler = std::make_unique<optim::CosineAnnealingLR>(*t.optimizer, 4);
  Tensor x = loom::testing::random_tensor({2, 3, 8, 8}, seed, -1, 1, DType::f32);
  cross_entropy((*t.model)(x), Tensor::from_vector<int64_t>({1, 2}, {2})).backward();
  t.optimizer->step();
  t.scheduler->step();
  return t;
}

}  // namespace

TEST_SUITE("checkpoint") {
  TEST_CASE("the file is a safetensors file: header length, JSON header, little-endian data") {
    TempDir dir;
    const fs::path path = dir / "t.safetensors";
    nn::save_safetensors(path, {{"a", Tensor::from_vector_as({1.5, -2.0}, {2}, DType::f32)},
                                {"b", Tensor::full({1, 1}, -2, DType::i64)}},
                         {{"k", "v"}});
    const std::string bytes = loom::testing::read_bytes(path);
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<uint8_t>(bytes[i]);
    CHECK(header_length % 8 == 0);  // data 8-byte aligned
    REQUIRE(8 + header_length + 16 == bytes.size());
    auto header = nlohmann::json::parse(bytes.substr(8, header_length));
    CHECK(header["a"]["dtype"] == "F32");
    CHECK(header["a"]["shape"] == nlohmann::json::array({2}));
    CHECK(header["a"]["data_offsets"] == nlohmann::json::array({0, 8}));
    CHECK(header["b"]["dtype"] == "I64");
    CHECK(header["b"]["shape"] == nlohmann::json::array({1, 1}));
    CHECK(header["b"]["data_offsets"] == nlohmann::json::array({8, 16}));
    CHECK(header["__metadata__"]["k"] == "v");
    const std::string data = bytes.substr(8 + header_length);
    CHECK(data.substr(0, 4) == std::string("\x00\x00\xc0\x3f", 4));  // 1.5f
    CHECK(data.substr(4, 4) == le_bytes(-2.0f));
    CHECK(data.substr(8, 8) == std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8));  // -2 as int64
  }

  TEST_CASE("every dtype round-trips with its values, shapes and metadata") {
    TempDir dir;
    const fs::path path = dir / "all.safetensors";
    const nn::NamedTensors tensors = every_dtype();
    nn::save_safetensors(path, tensors, {{"format", "pt"}, {"note", "héllo \"quoted\""}});
    nn::SafetensorsFile file = nn::load_safetensors(path);
    check_equal(file.tensors, tensors);
    CHECK(file.metadata == nn::Metadata{{"format", "pt"}, {"note", "héllo \"quoted\""}});
    for (auto& [name, t] : file.tensors) CHECK(t.device().is_cpu());
    CHECK(nn::parse_safetensors_dtype("BF16") == DType::bf16);
    CHECK_FALSE(nn::parse_safetensors_dtype("F8_E4M3").has_value());
  }

  TEST_CASE("writes replace the file atomically and leave no temporary files") {
    TempDir dir;
    const fs::path path = dir / "model.checkpoint";
    nn::save_safetensors(path, {{"x", Tensor::full({3}, 1.0)}});
    nn::save_safetensors(path, {{"x", Tensor::full({3}, 2.0)}});
    CHECK(nn::load_safetensors(path).tensors[0].second.to_vector<float>() == std::vector<float>(3, 2.0f));
    // A failing save (an undefined tensor) is caught before the file is touched.
    CHECK(contains(error_of([&] { nn::save_safetensors(path, {{"x", Tensor::full({3}, 3.0)}, {"bad", Tensor()}}); }),
                   "tensor 'bad' is undefined"));
    CHECK(contains(error_of([&] { nn::save_safetensors(path, {{"x", Tensor::zeros({1})}, {"x", Tensor::zeros({1})}}); }),
                   "'x' is given twice"));
    CHECK(nn::load_safetensors(path).tensors[0].second.to_vector<float>() == std::vector<float>(3, 2.0f));
    int files = 0;
    for (auto& entry : fs::directory_iterator(dir.path())) {
      ++files;
      CHECK(entry.path().filename() == "model.checkpoint");
    }
    CHECK(files == 1);
    CHECK((fs::status(path).permissions() & fs::perms::others_read) != fs::perms::none);
    const std::string missing_dir = error_of([&] { nn::save_safetensors(dir / "no/such/dir/x.ckpt", {}); });
    CHECK(contains(missing_dir, "no/such/dir"));
    CHECK(contains(missing_dir, "does not exist"));
  }

  TEST_CASE("a checkpoint holds the state_dict under PyTorch's names and the training state beside it") {
    TempDir dir;
    const fs::path path = dir / "1GPU_1epoch.checkpoint";
    Trained run = trained_resnet(5);
    nn::TrainingState state;
    state.epoch = 1;
    state.step = 17;
    state.optimizer = run.optimizer->state();
    state.scheduler_last_epoch = run.scheduler->last_epoch();
    state.sampler_epoch = 0;
    default_generator().next_u64();
    state.generators["default"] = {default_generator().seed(), default_generator().counter()};
    state.generators["augment"] = {UINT64_MAX, 3};
    state.extra_tensors = {{"grad_scaler.scale", Tensor::full({}, 65536.0)},
                           {"grad_scaler.growth_tracker", Tensor::full({}, 12, DType::i64)}};
    state.extra_metadata = {{"model", "resnet18"}};
    nn::save_checkpoint(path, {run.model->state_dict(), state});

    // Plain names for the model: torch's load_state_dict takes them as they are.
    nn::SafetensorsFile raw = nn::load_safetensors(path);
    CHECK(raw.tensors.front().first == "conv1.weight");
    CHECK(raw.metadata.at("format") == "pt");
    bool has_momentum = false;
    for (auto& [name, t] : raw.tensors) has_momentum |= name == "__training__.optimizer.0.0.momentum_buffer";
    CHECK(has_momentum);
    CHECK(raw.metadata.at("__training__.epoch") == "1");

    nn::Checkpoint loaded = nn::load_checkpoint(path);
    check_equal(loaded.model, run.model->state_dict());
    REQUIRE(loaded.training.has_value());
    const nn::TrainingState& got = *loaded.training;
    CHECK(got.epoch == 1);
    CHECK(got.step == 17);
    CHECK(got.scheduler_last_epoch == 1);
    CHECK(got.sampler_epoch == 0);
    CHECK(got.generators == state.generators);
    check_equal(got.optimizer, state.optimizer);
    check_equal(got.extra_tensors, state.extra_tensors);
    CHECK(got.extra_metadata == state.extra_metadata);

    // Restoring into a differently initialised model and optimizer reproduces them.
    Trained other = trained_resnet(6);
    nn::load_model_state(*other.model, loaded.model);
    other.optimizer->load_state(got.optimizer);
    check_equal(other.model->state_dict(), run.model->state_dict());
    check_equal(other.optimizer->state(), run.optimizer->state());

    // A plain state_dict file has no training state.
    nn::save_checkpoint(dir / "plain.safetensors", {run.model->state_dict(), std::nullopt});
    CHECK_FALSE(nn::load_checkpoint(dir / "plain.safetensors").training.has_value());
  }

  TEST_CASE("model mismatches are reported by name: shape, dtype, missing, unexpected") {
    manual_seed(1);
    auto model = nn::resnet18(10);
    const std::string source = "checkpoint ./x.checkpoint";
    auto state = model->state_dict();

    auto wrong_shape = state;
    for (auto& [name, t] : wrong_shape) {
      if (name == "fc.weight") t = Tensor::zeros({1000, 512});
    }
    std::string message = error_of([&] { nn::load_model_state(*model, wrong_shape, source); });
    CHECK(contains(message, "checkpoint ./x.checkpoint does not match the model"));
    CHECK(contains(message, "'fc.weight' has shape [1000, 512], the model expects [10, 512]"));

    auto wrong_dtype = state;
    for (auto& [name, t] : wrong_dtype) {
      if (name == "layer2.0.bn1.running_var") t = t.to(DType::f64);
    }
    message = error_of([&] { nn::load_model_state(*model, wrong_dtype, source); });
    CHECK(contains(message, "'layer2.0.bn1.running_var' has dtype F64, the model expects F32"));

    auto renamed = state;
    renamed[0].first = "module.conv1.weight";  // DDP-wrapped names
    message = error_of([&] { nn::load_model_state(*model, renamed, source); });
    CHECK(contains(message, "missing 'conv1.weight'"));
    CHECK(contains(message, "unexpected 'module.conv1.weight'"));

    // Another architecture: the first few problems, then a count.
    message = error_of([&] { nn::load_model_state(*model, nn::resnet34(nn::ResNetOptions().num_classes(10).width(8))->state_dict(), source); });
    CHECK(contains(message, "more"));
    CHECK(message.size() < 1200);

    // Nothing was changed by the failed loads.
    check_equal(model->state_dict(), state);
  }

  TEST_CASE("malformed files give an error naming the file and the problem") {
    TempDir dir;
    const std::string good_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::string eight(8, '\0');
    struct Case {
      const char* what;
      std::string bytes;
      const char* expected;
    };
    const Case cases[] = {
        {"empty file", "", "too few for a safetensors file"},
        {"short file", "abc", "too few for a safetensors file"},
        {"header length past the end", loom::testing::safetensors_bytes(good_header, eight, 1 << 20),
         "declares a 1048576-byte header"},
        {"absurd header length", loom::testing::safetensors_bytes(good_header, eight, int64_t{1} << 62),
         "-byte header but has"},
        {"invalid JSON", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32",)", eight), "not valid JSON"},
        {"JSON that is not an object", loom::testing::safetensors_bytes("[1, 2, 3]", eight),
         "the header is not a JSON object"},
        {"unknown dtype", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", eight),
         "tensor 'a' has dtype 'F8'"},
        {"dtype not a string", loom::testing::safetensors_bytes(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", eight),
         "tensor 'a': dtype is not a string"},
        {"missing field", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
         "tensor 'a' needs dtype, shape and data_offsets"},
        {"negative size", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
         "has an entry that is not a size"},
        {"offsets past the data", loom::testing::safetensors_bytes(good_header, std::string(4, '\0')),
         "tensor 'a': data_offsets [0, 8] run past the end of the data (4 bytes)"},
        {"offsets reversed", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
         "end before they begin"},
        {"offsets disagree with the shape",
         loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
         "hold 8 bytes but F32 [3] needs 12"},
        {"offsets not a pair", loom::testing::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
         "is not a pair of byte offsets"},
        {"overlapping tensors",
         loom::testing::safetensors_bytes(
             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             std::string(12, '\0')),
         "tensors 'a' and 'b' overlap"},
        {"metadata not strings", loom::testing::safetensors_bytes(R"({"__metadata__":{"epoch":3}})", ""),
         "__metadata__ entry 'epoch' is not a string"},
        {"training epoch not a number",
         loom::testing::safetensors_bytes(R"({"__metadata__":{"__training__.epoch":"two","__training__.step":"1"}})", ""),
         "metadata '__training__.epoch' is 'two', not an integer"},
        {"unknown training tensor",
         loom::testing::safetensors_bytes(
             R"({"__training__.mystery":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"__training__.epoch":"1","__training__.step":"1"}})",
             std::string(1, '\0')),
         "unknown training-state tensor '__training__.mystery'"},
        {"training state without epoch",
         loom::testing::safetensors_bytes(R"({"__metadata__":{"__training__.step":"1"}})", ""),
         "lacks its epoch or step"},
        {"negative step",
         loom::testing::safetensors_bytes(R"({"__metadata__":{"__training__.epoch":"0","__training__.step":"-3"}})", ""),
         "metadata '__training__.step' is negative"},
        {"negative sampler epoch",
         loom::testing::safetensors_bytes(
             R"({"__metadata__":{"__training__.epoch":"0","__training__.step":"1","__training__.sampler_epoch":"-1"}})", ""),
         "metadata '__training__.sampler_epoch' is negative"},
        {"negative schedule position",
         loom::testing::safetensors_bytes(
             R"({"__metadata__":{"__training__.epoch":"0","__training__.step":"1","__training__.scheduler_last_epoch":"-7"}})",
             ""),
         "metadata '__training__.scheduler_last_epoch' is negative"},
        {"more batches in the epoch than steps in all",
         loom::testing::safetensors_bytes(
             R"({"__metadata__":{"__training__.epoch":"1","__training__.step":"2","__training__.epoch_step":"5"}})", ""),
         "records batch 5 of its epoch after only 2 steps in all"},
    };
    for (const Case& c : cases) {
      INFO("case: ", c.what);
      const fs::path path = dir / "bad.safetensors";
      loom::testing::write_bytes(path, c.bytes);
      const std::string message = error_of([&] { nn::load_checkpoint(path); });
      CHECK_MESSAGE(contains(message, "checkpoint " + path.string()), message);
      CHECK_MESSAGE(contains(message, c.expected), message);
    }
    const std::string missing = error_of([&] { nn::load_checkpoint(dir / "nowhere.checkpoint"); });
    CHECK(contains(missing, "nowhere.checkpoint cannot be opened: No such file or directory"));
    CHECK(contains(error_of([&] { nn::load_checkpoint(dir.path()); }), "is not a regular file"));
    // A FIFO named like a checkpoint: refused at once; opening it for reading would wait for a writer.
    REQUIRE(::mkfifo((dir / "fifo.checkpoint").c_str(), 0600) == 0);
    CHECK(contains(error_of([&] { nn::load_checkpoint(dir / "fifo.checkpoint"); }), "is not a regular file"));
  }

  TEST_CASE("every truncation and every corrupted header byte of a real checkpoint is an error, never a crash") {
    TempDir dir;
    const fs::path good = dir / "good.checkpoint";
    nn::TrainingState state;
    state.epoch = 2;
    state.optimizer = {{"0.0.momentum_buffer", Tensor::full({3}, 0.5)}};
    nn::save_checkpoint(good, {every_dtype(), state});
    const std::string bytes = loom::testing::read_bytes(good);
    REQUIRE_NOTHROW(nn::load_checkpoint(good));
    const fs::path bad = dir / "bad.checkpoint";
    int errors = 0, cases = 0;
    for (size_t length = 0; length < bytes.size(); length += 7) {
      loom::testing::write_bytes(bad, bytes.substr(0, length));
      ++cases;
      const std::string message = error_of([&] { nn::load_checkpoint(bad); });
      errors += contains(message, "checkpoint " + bad.string());
    }
    CHECK(errors == cases);
    // Flip bytes of the length field and the header: an error or (for a
    // harmless change, e.g. inside padding) a successful load, never a crash.
    uint64_t header_length = 0;
    std::memcpy(&header_length, bytes.data(), 8);
    for (size_t i = 0; i < 8 + header_length; i += 3) {
      std::string corrupt = bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
      loom::testing::write_bytes(bad, corrupt);
      try {
        nn::load_checkpoint(bad);
      } catch (const Error& e) {
        CHECK_MESSAGE(contains(e.what(), bad.string()), e.what());
      }
    }
  }
}

// Durability: a CRC-32 that catches corrupt data, write failures that name
// the file and keep the previous checkpoint, leftovers of killed writers.
TEST_SUITE("checkpoint") {
  TEST_CASE("the data's CRC-32 is stored and a flipped data byte is reported as corruption") {
    TempDir dir;
    const fs::path path = dir / "x.safetensors";
    const Tensor x = Tensor::from_vector_as({1, 2, 3, 4}, {4}, DType::f32);
    nn::save_safetensors(path, {{"x", x}}, {{"note", "kept"}});
    // The stored value is zlib's CRC-32 of the 16 data bytes (Python: zlib.crc32(data)).
    const nn::Metadata metadata = nn::read_safetensors_metadata(path);
    CHECK(metadata.at("note") == "kept");
    const std::vector<float> values = {1, 2, 3, 4};
    const uLong expected = ::crc32_z(0L, reinterpret_cast<const Bytef*>(values.data()), 16);
    CHECK(metadata.at(nn::kDataCrc32Key) == std::to_string(expected));
    CHECK(nn::load_safetensors(path).metadata.count(nn::kDataCrc32Key) == 0);  // checked, not passed on

    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    bytes[bytes.size() - 3] ^= 0x01;  // a bit of the last float
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const std::string error = error_of([&] { nn::load_safetensors(path); });
    CHECK(contains(error, path.string()));
    CHECK(contains(error, "CRC-32"));
    CHECK(contains(error, "corrupt"));
  }

  TEST_CASE("a mid-epoch position round-trips") {
    TempDir dir;
    nn::TrainingState state;
    state.epoch = 2;
    state.epoch_step = 17;
    state.step = 97;
    nn::save_checkpoint(dir / "c", {{{"w", Tensor::zeros({2})}}, state});
    const nn::Checkpoint loaded = nn::load_checkpoint(dir / "c");
    REQUIRE(loaded.training.has_value());
    CHECK(loaded.training->epoch == 2);
    CHECK(loaded.training->epoch_step == 17);
    CHECK(loaded.training->step == 97);
  }

  TEST_CASE("a write that fails (file size limit) names the file and the cause, keeps the old file, leaves no temporary") {
    TempDir dir;
    const fs::path path = dir / "big.checkpoint";
    nn::save_safetensors(path, {{"x", Tensor::full({4}, 1.0)}});
    // Like a full disk: RLIMIT_FSIZE makes write() fail with EFBIG once SIGXFSZ is ignored.
    struct sigaction ignore {}, previous {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGXFSZ, &ignore, &previous);
    rlimit saved{};
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit limited = saved;
    limited.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    const std::string error = error_of([&] { nn::save_safetensors(path, {{"x", Tensor::full({1 << 16}, 2.0)}}); });
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::sigaction(SIGXFSZ, &previous, nullptr);
    CHECK(contains(error, path.string()));
    CHECK(contains(error, "file size limit"));
    CHECK(contains(error, "previous checkpoint"));
    CHECK(nn::load_safetensors(path).tensors[0].second.to_vector<float>() == std::vector<float>(4, 1.0f));
    int files = 0;
    for ([[maybe_unused]] auto& entry : fs::directory_iterator(dir.path())) ++files;
    CHECK(files == 1);
  }

  TEST_CASE("remove_stale_temporaries removes what killed writers left, nothing else") {
    TempDir dir;
    std::ofstream(dir / ".a.checkpoint.tmp-Ab12Cd") << "partial";
    std::ofstream(dir / "a.checkpoint") << "kept";
    std::ofstream(dir / ".hidden") << "kept";
    std::ofstream(dir / "b.tmp-123456") << "kept";  // not hidden: not ours
    const std::vector<fs::path> removed = nn::remove_stale_temporaries(dir.path());
    REQUIRE(removed.size() == 1);
    CHECK(removed[0].filename() == ".a.checkpoint.tmp-Ab12Cd");
    CHECK(fs::exists(dir / "a.checkpoint"));
    CHECK(fs::exists(dir / ".hidden"));
    CHECK(fs::exists(dir / "b.tmp-123456"));
  }
}
