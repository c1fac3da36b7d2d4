// A restricted reader for the Python pickles that hold dicts of numpy arrays
// (torchvision's CIFAR-10 python layout): it interprets the opcodes that
// format uses into plain values, executes nothing, and refuses everything else
// with an error naming the file and the byte offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace loom::data::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct None {};
// A numpy dtype as numpy pickles it: dtype("u1", False, True) then its state.
struct Dtype {
  std::string type;       // numpy's type string: "u1", "i8", "f4", ...
  char byte_order = '|';  // from the state: '|' (not applicable), '<', '=' or '>'
  int64_t item_size = 0;
};
// A numpy ndarray, C order. `dtype` is numpy's type string without byte
// order ("u1", "i8"); `data` holds shape-product x item_size bytes.
struct Array {
  Dtype dtype;  // dtype.type is empty until ndarray.__setstate__ (BUILD) has run
  std::vector<int64_t> shape;
  std::string data;
};
// Text (str) and bytes (Python 2 str, Python 3 bytes) both read as a byte
// string; a value remembers which it was for error messages only.
struct Text {
  std::string bytes;
  bool is_unicode = false;
};
struct List {
  std::vector<ValuePtr> items;
};
struct Tuple {
  std::vector<ValuePtr> items;
};
// Keys are text or bytes; both compare by their bytes.
using Dict = std::map<std::string, ValuePtr>;

// One of the allowed callables a GLOBAL names, e.g. numpy.ndarray.
struct Global {
  std::string module;
  std::string name;
};

struct Value {
  std::variant<None, bool, int64_t, Text, List, Tuple, Dict, Array, Dtype, Global> content;
  // Containment rules that keep the value a finite tree: a container put into
  // another is sealed (no opcode may change it afterwards), and `height`
  // (levels of containers below) stays small.
  bool sealed = false;
  int height = 0;
};

// Parses `bytes`, the contents of `path` (named in errors), into the value
// the pickle holds. Accepted: protocols 2 to 5; None, bool, int (up to 64
// bits), str, bytes, bytearray, tuple, list, dict; numpy arrays as numpy
// pickles them (numpy.core.multiarray._reconstruct + ndarray.__setstate__,
// numpy.core.numeric._frombuffer for protocol 5, also under numpy._core),
// numpy dtypes, and _codecs.encode(text, 'latin1') (how Python 3 pickles bytes
// at protocol 2). Every length is checked against the bytes that remain.
// Throws loom::Error "pickle file PATH, byte N: ..." for anything else.
Value parse(const std::string& bytes, const std::filesystem::path& path);

// Parses the file as it is read, up to the STOP opcode: bytes after the
// pickle are ignored, as Python's pickle.load ignores them, and never read
// (a batch followed by a gigabyte of stray bytes costs the batch's size).
// A path that is not a regular file (a FIFO) is refused by name.
Value load(const std::filesystem::path& path);

}  // namespace loom::data::pickle
