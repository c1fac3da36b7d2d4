// The restricted pickle interpreter: a stack machine over the opcodes that
// pickled dicts of numpy arrays use, with every length checked against the
// bytes left and every GLOBAL checked against a short allow-list.
#include <loom/data/pickle.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include <loom/core/error.h>
#include <loom/data/input_file.h>

namespace loom::data::pickle {
namespace fs = std::filesystem;

namespace {

// The few callables the format uses; a GLOBAL naming anything else is refused.
enum class Callable { reconstruct, ndarray, dtype, frombuffer, codecs_encode };

std::optional<Callable> allowed_global(const std::string& module, const std::string& name) {
  const bool multiarray = module == "numpy.core.multiarray" || module == "numpy._core.multiarray";
  const bool numeric = module == "numpy.core.numeric" || module == "numpy._core.numeric";
  if (multiarray && name == "_reconstruct") return Callable::reconstruct;
  if (numeric && name == "_frombuffer") return Callable::frombuffer;
  if (module == "numpy" && name == "ndarray") return Callable::ndarray;
  if (module == "numpy" && name == "dtype") return Callable::dtype;
  if (module == "_codecs" && name == "encode") return Callable::codecs_encode;
  return std::nullopt;
}

using Item = ValuePtr;

// The pickle's bytes in order: a string in memory, or a file read as the
// parser asks for them, so that nothing after the STOP opcode is read (a
// batch followed by a gigabyte of stray bytes costs the batch's size).
class Source {
 public:
  explicit Source(const std::string& bytes) : memory_(&bytes), size_(bytes.size()) {}
  explicit Source(InputFile& file) : file_(&file), size_(file.size()) {}

  uint64_t size() const { return size_; }
  uint64_t position() const { return position_; }
  uint64_t remaining() const { return size_ - position_; }

  // Copies the next `count` bytes, which the caller has checked remain.
  void read(char* out, size_t count) {
    if (memory_) {
      std::memcpy(out, memory_->data() + position_, count);
      position_ += count;
      return;
    }
    while (count > 0) {
      if (buffer_at_ == buffer_.size()) {
        if (count >= kBufferBytes) {  // a large string or array: straight into its storage
          read_file(out, count);
          return;
        }
        buffer_.resize(static_cast<size_t>(std::min<uint64_t>(kBufferBytes, remaining())));
        buffer_at_ = 0;
        const uint64_t at = position_;
        read_file(buffer_.data(), buffer_.size());
        position_ = at;
      }
      const size_t chunk = std::min(count, buffer_.size() - buffer_at_);
      std::memcpy(out, buffer_.data() + buffer_at_, chunk);
      buffer_at_ += chunk;
      position_ += chunk;
      out += chunk;
      count -= chunk;
    }
  }

 private:
  static constexpr size_t kBufferBytes = size_t{64} << 10;

  void read_file(char* out, size_t count) {
    if (file_->read(out, count) != count) {
      LOOM_FAIL("pickle file ", file_->path().string(), ": the file shrank while it was read");
    }
    position_ += count;
  }

  const std::string* memory_ = nullptr;
  InputFile* file_ = nullptr;
  uint64_t size_ = 0;
  uint64_t position_ = 0;
  std::vector<char> buffer_;
  size_t buffer_at_ = 0;
};

constexpr int max_height = 32;

class Parser {
 public:
  Parser(Source& source, const fs::path& path) : source_(source), path_(path) {}

  Value run() {
    for (;;) {
      if (source_.remaining() == 0) {
        if (source_.position() == 0) fail(0, "is empty: not a pickle");
        fail(source_.position(), "the pickle ends without its STOP opcode (truncated?)");
      }
      opcode_at_ = source_.position();
      const uint8_t opcode = next_byte();
      if (opcode_at_ == 0 && opcode != 0x80) {
        fail(0, "does not start with the PROTO opcode (0x80): not a pickle of protocol 2 or later");
      }
      if (opcode == '.') break;
      step(opcode);
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      fail(opcode_at_, "STOP with ", stack_.size(), " items on the stack and ", marks_.size(),
           " open marks; expected exactly one value");
    }
    return *stack_.back();
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(size_t offset, const Parts&... parts) const {
    LOOM_FAIL("pickle file ", path_.string(), ", byte ", offset, ": ", parts...);
  }

  uint64_t remaining() const { return source_.remaining(); }

  void need(uint64_t count, const char* what) const {
    if (count > remaining()) {
      fail(opcode_at_, what, " needs ", count, " bytes but only ", remaining(), " remain in the file");
    }
  }

  uint8_t next_byte() {
    need(1, "the opcode");
    char byte = 0;
    source_.read(&byte, 1);
    return static_cast<uint8_t>(byte);
  }

  uint64_t unsigned_le(int width) {
    need(static_cast<uint64_t>(width), "an integer argument");
    uint64_t value = 0;
    char bytes[8] = {};
    source_.read(bytes, static_cast<size_t>(width));
    for (int i = 0; i < width; ++i) value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
    return value;
  }

  std::string take(uint64_t count, const char* what) {
    need(count, what);
    std::string out(static_cast<size_t>(count), '\0');
    source_.read(out.data(), out.size());
    return out;
  }

  std::string line(const char* what) {
    // GLOBAL's names are short; a line as long as the file is not one.
    constexpr size_t kMaxLine = 1024;
    std::string out;
    for (;;) {
      if (remaining() == 0 || out.size() > kMaxLine) fail(opcode_at_, what, " has no terminating newline");
      char byte = 0;
      source_.read(&byte, 1);
      if (byte == '\n') return out;
      out.push_back(byte);
    }
  }

  static ValuePtr make(auto content) {
    auto value = std::make_shared<Value>();
    value->content = std::move(content);
    return value;
  }

  void push(ValuePtr value) { stack_.push_back(std::move(value)); }

  Item pop(const char* for_opcode) {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) fail(opcode_at_, for_opcode, " needs a value but the stack is empty");
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }

  ValuePtr pop_value(const char* for_opcode) { return pop(for_opcode); }

  // The top `count` values, in the order they were pushed.
  std::vector<ValuePtr> pop_values(size_t count, const char* for_opcode) {
    std::vector<ValuePtr> items(count);
    for (size_t i = count; i-- > 0;) items[i] = pop_value(for_opcode);
    return items;
  }

  // The items above the most recent MARK, which is removed.
  std::vector<ValuePtr> pop_mark(const char* for_opcode) {
    if (marks_.empty()) fail(opcode_at_, for_opcode, " without a MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items;
    for (size_t i = mark; i < stack_.size(); ++i) items.push_back(stack_[i]);
    stack_.resize(mark);
    return items;
  }

  Item& top(const char* for_opcode) {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) fail(opcode_at_, for_opcode, " needs a value but the stack is empty");
    return stack_.back();
  }

  // Puts `child` into `parent`: seals the child, refuses a sealed parent (so no
  // value can come to contain itself) and trees deeper than max_height.
  void adopt(Value& parent, Value& child, const char* for_opcode) {
    if (&parent == &child || parent.sealed) {
      fail(opcode_at_, for_opcode, " modifies a container that is already inside another one (or itself)");
    }
    child.sealed = true;
    parent.height = std::max(parent.height, child.height + 1);
    if (parent.height > max_height) fail(opcode_at_, "containers nested more than ", max_height, " deep");
  }

  ValuePtr make_tuple(std::vector<ValuePtr> items, const char* for_opcode) {
    ValuePtr tuple = make(Tuple{});
    for (const ValuePtr& item : items) adopt(*tuple, *item, for_opcode);
    tuple->content = Tuple{std::move(items)};
    return tuple;
  }

  template <class T>
  T& as(const ValuePtr& value, const char* what) {
    T* content = std::get_if<T>(&value->content);
    if (!content) fail(opcode_at_, what);
    return *content;
  }

  static std::string key_of(const Value& value) {
    if (const Text* text = std::get_if<Text>(&value.content)) return text->bytes;
    if (const int64_t* number = std::get_if<int64_t>(&value.content)) return std::to_string(*number);
    return {};
  }

  void set_items(const ValuePtr& dict_value, const std::vector<ValuePtr>& items, const char* for_opcode) {
    Dict& dict = as<Dict>(dict_value, "SETITEM(S) on something that is not a dict");
    if (items.size() % 2 != 0) fail(opcode_at_, for_opcode, " with an odd number of items");
    for (size_t i = 0; i < items.size(); i += 2) {
      if (!std::holds_alternative<Text>(items[i]->content)) {
        fail(opcode_at_, "a dict key that is not str or bytes");
      }
      adopt(*dict_value, *items[i + 1], for_opcode);
      dict[key_of(*items[i])] = items[i + 1];
    }
  }

  void append(const ValuePtr& list_value, const std::vector<ValuePtr>& items, const char* for_opcode) {
    List& list = as<List>(list_value, "APPEND(S) to something that is not a list");
    for (const ValuePtr& item : items) {
      adopt(*list_value, *item, for_opcode);
      list.items.push_back(item);
    }
  }

  void memo_put(uint64_t index) {
    if (memo_.size() >= source_.size()) fail(opcode_at_, "more memo entries than bytes in the file");
    memo_[index] = top("PUT");
  }

  void memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) fail(opcode_at_, "GET of memo entry ", index, " that was never stored");
    stack_.push_back(found->second);
  }

  // numpy's item size for a type string such as "u1" or "i8".
  Dtype parse_dtype(const std::string& type) {
    const bool known_kind = type.size() == 2 && std::strchr("biuf", type[0]) != nullptr;
    const int size = known_kind ? type[1] - '0' : 0;
    if (!known_kind || (size != 1 && size != 2 && size != 4 && size != 8) || (type[0] == 'f' && size < 4) ||
        (type[0] == 'b' && size != 1)) {
      fail(opcode_at_, "numpy dtype '", type, "' is not a boolean, integer or float type this reader handles");
    }
    return Dtype{type, '|', size};
  }

  void finish_array(Array& array, const Dtype& dtype, const std::vector<int64_t>& shape, const std::string& data,
                    bool fortran_order) {
    if (!array.dtype.type.empty()) fail(opcode_at_, "a numpy array's state set twice");
    if (dtype.byte_order == '>' && dtype.item_size > 1) {
      fail(opcode_at_, "big-endian numpy arrays ('>", dtype.type, "') are not supported");
    }
    if (fortran_order && shape.size() > 1) fail(opcode_at_, "Fortran-ordered numpy arrays are not supported");
    uint64_t elements = 1;
    for (const int64_t side : shape) {
      if (side < 0) fail(opcode_at_, "a numpy array with negative dimension ", side);
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(side), &elements)) {
        fail(opcode_at_, "a numpy array shape whose size overflows 64 bits");
      }
    }
    if (elements > data.size() || elements * static_cast<uint64_t>(dtype.item_size) != data.size()) {
      fail(opcode_at_, "numpy array of ", elements, " '", dtype.type, "' elements has ", data.size(),
           " data bytes; expected ", elements * static_cast<uint64_t>(dtype.item_size));
    }
    array.dtype = dtype;
    array.shape = shape;
    array.data = data;
  }

  std::vector<int64_t> shape_of(const ValuePtr& value) {
    std::vector<int64_t> shape;
    for (const ValuePtr& side : as<Tuple>(value, "a numpy array shape that is not a tuple").items) {
      shape.push_back(as<int64_t>(side, "a numpy array dimension that is not an int"));
    }
    return shape;
  }

  bool flag_of(const ValuePtr& value, const char* what) {
    if (const bool* flag = std::get_if<bool>(&value->content)) return *flag;
    if (const int64_t* number = std::get_if<int64_t>(&value->content)) return *number != 0;
    fail(opcode_at_, what, " is not a bool");
  }

  ValuePtr reduce(Callable callable, const std::vector<ValuePtr>& args) {
    switch (callable) {
      case Callable::codecs_encode: {
        if (args.size() != 2 || as<Text>(args[1], "_codecs.encode's encoding is not a str").bytes != "latin1") {
          fail(opcode_at_, "_codecs.encode is accepted only as encode(str, 'latin1')");
        }
        return make(Text{latin1_of(as<Text>(args[0], "_codecs.encode of something that is not a str").bytes), false});
      }
      case Callable::dtype: {
        if (args.empty() || args.size() > 3) fail(opcode_at_, "numpy.dtype with ", args.size(), " arguments");
        return make(parse_dtype(as<Text>(args[0], "numpy.dtype of something that is not a str").bytes));
      }
      case Callable::reconstruct: {
        const Global* type = args.empty() ? nullptr : std::get_if<Global>(&args[0]->content);
        if (args.size() != 3 || !type || type->name != "ndarray") {
          fail(opcode_at_, "numpy _reconstruct is accepted only as _reconstruct(numpy.ndarray, shape, dtype char)");
        }
        return make(Array{});  // completed by BUILD (ndarray.__setstate__)
      }
      case Callable::frombuffer: {
        if (args.size() != 4) fail(opcode_at_, "numpy _frombuffer with ", args.size(), " arguments; expected 4");
        Array array;
        const std::string& order = as<Text>(args[3], "numpy _frombuffer order is not a str").bytes;
        finish_array(array, as<Dtype>(args[1], "numpy _frombuffer's dtype is not a numpy dtype"), shape_of(args[2]),
                     as<Text>(args[0], "numpy _frombuffer's buffer is not bytes").bytes, order == "F");
        return make(std::move(array));
      }
      case Callable::ndarray: break;
    }
    fail(opcode_at_, "REDUCE of numpy.ndarray itself (only as _reconstruct's argument)");
  }

  // Decodes UTF-8 text whose code points are all below 256 into one byte each.
  std::string latin1_of(const std::string& utf8) {
    std::string out;
    out.reserve(utf8.size());
    for (size_t i = 0; i < utf8.size(); ++i) {
      const auto lead = static_cast<uint8_t>(utf8[i]);
      if (lead < 0x80) {
        out.push_back(static_cast<char>(lead));
      } else if ((lead == 0xC2 || lead == 0xC3) && i + 1 < utf8.size() &&
                 (static_cast<uint8_t>(utf8[i + 1]) & 0xC0) == 0x80) {
        out.push_back(static_cast<char>(((lead & 0x03) << 6) | (static_cast<uint8_t>(utf8[i + 1]) & 0x3F)));
        ++i;
      } else {
        fail(opcode_at_, "_codecs.encode(..., 'latin1') of text that is not latin-1");
      }
    }
    return out;
  }

  void build() {
    ValuePtr state = pop_value("BUILD");
    ValuePtr target = top("BUILD");
    if ( target->sealed) fail(opcode_at_, "BUILD on something that is not a numpy array or dtype");
    if (Dtype* dtype = std::get_if<Dtype>(&target->content)) {
      const std::vector<ValuePtr>& fields = as<Tuple>(state, "a numpy dtype state that is not a tuple").items;
      if (fields.size() < 2) fail(opcode_at_, "a numpy dtype state with ", fields.size(), " fields");
      const std::string& order = as<Text>(fields[1], "a numpy dtype byte order that is not a str").bytes;
      if (order.size() != 1 || std::strchr("|<=>", order[0]) == nullptr) {
        fail(opcode_at_, "numpy dtype byte order '", order, "'");
      }
      dtype->byte_order = order[0];
      return;
    }
    Array& array = as<Array>(target, "BUILD on something that is not a numpy array or dtype");
    const std::vector<ValuePtr>& fields = as<Tuple>(state, "a numpy array state that is not a tuple").items;
    // (version, shape, dtype, is_fortran, data), or the same without version.
    if (fields.size() != 5 && fields.size() != 4) fail(opcode_at_, "a numpy array state with ", fields.size(), " fields");
    const size_t first = fields.size() - 4;
    const Text* data = std::get_if<Text>(&fields[first + 3]->content);
    if (!data) fail(opcode_at_, "a numpy array whose data is not bytes (object arrays are not supported)");
    finish_array(array, as<Dtype>(fields[first + 1], "a numpy array state without a dtype"), shape_of(fields[first]),
                 data->bytes, flag_of(fields[first + 2], "a numpy array's is_fortran"));
  }

  void step(uint8_t opcode) {
    switch (opcode) {
      case 0x80: {  // PROTO
        const uint8_t protocol = next_byte();
        if (protocol < 2 || protocol > 5) fail(opcode_at_, "pickle protocol ", int{protocol}, " (accepted: 2 to 5)");
        return;
      }
      case 0x95: need(unsigned_le(8), "FRAME"); return;  // FRAME: only a length hint
      case '(': marks_.push_back(stack_.size()); return;
      case '}': push(make(Dict{})); return;
      case ']': push(make(List{})); return;
      case ')': push(make(Tuple{})); return;
      case 'N': push(make(None{})); return;
      case 0x88: push(make(true)); return;
      case 0x89: push(make(false)); return;
      case 'K': push(make(static_cast<int64_t>(unsigned_le(1)))); return;
      case 'M': push(make(static_cast<int64_t>(unsigned_le(2)))); return;
      case 'J': push(make(static_cast<int64_t>(static_cast<int32_t>(unsigned_le(4))))); return;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const uint64_t width = unsigned_le(1);
        if (width > 8) fail(opcode_at_, "an integer of ", width, " bytes (at most 8 are accepted)");
        uint64_t value = width == 0 ? 0 : unsigned_le(static_cast<int>(width));
        if (width > 0 && width < 8 && (value >> (8 * width - 1)) != 0) value |= ~uint64_t{0} << (8 * width);
        push(make(static_cast<int64_t>(value)));
        return;
      }
      case 'U': push(make(Text{take(unsigned_le(1), "SHORT_BINSTRING"), false})); return;
      case 'T': {
        const auto length = static_cast<int32_t>(unsigned_le(4));
        if (length < 0) fail(opcode_at_, "BINSTRING with negative length ", length);
        push(make(Text{take(static_cast<uint64_t>(length), "BINSTRING"), false}));
        return;
      }
      case 'C': push(make(Text{take(unsigned_le(1), "SHORT_BINBYTES"), false})); return;
      case 'B': push(make(Text{take(unsigned_le(4), "BINBYTES"), false})); return;
      case 0x8e: push(make(Text{take(unsigned_le(8), "BINBYTES8"), false})); return;
      case 0x96: push(make(Text{take(unsigned_le(8), "BYTEARRAY8"), false})); return;
      case 0x8c: push(make(Text{take(unsigned_le(1), "SHORT_BINUNICODE"), true})); return;
      case 'X': push(make(Text{take(unsigned_le(4), "BINUNICODE"), true})); return;
      case 0x8d: push(make(Text{take(unsigned_le(8), "BINUNICODE8"), true})); return;
      case 't': push(make_tuple(pop_mark("TUPLE"), "TUPLE")); return;
      case 0x85: case 0x86: case 0x87:  // TUPLE1..3
        push(make_tuple(pop_values(static_cast<size_t>(opcode - 0x84), "TUPLEn"), "TUPLEn"));
        return;
      case 'a': case 'e': {  // APPEND (one item), APPENDS (the items above the MARK)
        const char* name = opcode == 'a' ? "APPEND" : "APPENDS";
        const std::vector<ValuePtr> items = opcode == 'a' ? pop_values(1, name) : pop_mark(name);
        append(top(name), items, name);
        return;
      }
      case 's': case 'u': {  // SETITEM (one key and value), SETITEMS (the pairs above the MARK)
        const char* name = opcode == 's' ? "SETITEM" : "SETITEMS";
        const std::vector<ValuePtr> items = opcode == 's' ? pop_values(2, name) : pop_mark(name);
        set_items(top(name), items, name);
        return;
      }
      case 'q': memo_put(unsigned_le(1)); return;
      case 'r': memo_put(unsigned_le(4)); return;
      case 0x94: memo_put(memo_.size()); return;  // MEMOIZE
      case 'h': memo_get(unsigned_le(1)); return;
      case 'j': memo_get(unsigned_le(4)); return;
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = line("GLOBAL's module");
        const std::string name = line("GLOBAL's name");
        push_global(module, name);
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        ValuePtr name = pop_value("STACK_GLOBAL");
        ValuePtr module = pop_value("STACK_GLOBAL");
        push_global(as<Text>(module, "STACK_GLOBAL's module is not a str").bytes,
                    as<Text>(name, "STACK_GLOBAL's name is not a str").bytes);
        return;
      }
      case 'R': {
        ValuePtr args = pop_value("REDUCE");
        const ValuePtr function = pop("REDUCE");
        const Global& callable = as<Global>(function, "REDUCE of something that is not an allowed callable");
        push(reduce(*allowed_global(callable.module, callable.name),
                    as<Tuple>(args, "REDUCE's arguments are not a tuple").items));
        return;
      }
      case 'b': build(); return;
      default: break;
    }
    fail(opcode_at_, "opcode 0x", hex(opcode), printable(opcode),
         " is not one this reader accepts (it reads dicts of numpy arrays, as torchvision's CIFAR files are)");
  }

  void push_global(const std::string& module, const std::string& name) {
    const std::optional<Callable> callable = allowed_global(module, name);
    if (!callable) {
      fail(opcode_at_, "GLOBAL '", module, " ", name,
           "' is not allowed (only numpy's array and dtype reconstructors and _codecs.encode are)");
    }
    push(make(Global{module, name}));
  }

  static std::string hex(uint8_t byte) {
    const char* digits = "0123456789abcdef";
    return {digits[byte >> 4], digits[byte & 15]};
  }
  static std::string printable(uint8_t byte) {
    return byte >= 0x20 && byte < 0x7f ? str(" ('", static_cast<char>(byte), "')") : std::string();
  }

  Source& source_;
  const fs::path& path_;
  uint64_t opcode_at_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
};

}  // namespace

Value parse(const std::string& bytes, const fs::path& path) {
  Source source(bytes);
  return Parser(source, path).run();
}

Value load(const fs::path& path) {
  InputFile file(path, "pickle file");
  Source source(file);
  return Parser(source, path).run();
}

}  // namespace loom::data::pickle
