// Store helpers shared by every store, and PrefixStore.
#include "dist/store.h"

#include "core/error.h"

namespace loom::dist {

std::string Store::get_string(const std::string& key, Milliseconds timeout) {
  Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

void Store::throw_timeout(const char* what, const std::vector<std::string>& keys, Milliseconds timeout) {
  std::string names;
  for (size_t i = 0; i < keys.size(); ++i) names += str(i ? ", '" : "'", keys[i], "'");
  double seconds = static_cast<double>(timeout.count()) / 1000.0;
  LOOM_FAIL(what, ": timed out after ", seconds, " s waiting for key", keys.size() == 1 ? " " : "s ", names,
            "; the rank that should set it may have failed or not started");
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : Store(inner ? inner->timeout() : kDefaultTimeout), prefix_(std::move(prefix)), inner_(std::move(inner)) {
  LOOM_CHECK(inner_ != nullptr, "PrefixStore '", prefix_, "': the inner store is null");
}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> result;
  result.reserve(keys.size());
  for (const auto& key : keys) result.push_back(prefixed(key));
  return result;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(prefixed(key), value); }
Bytes PrefixStore::get(const std::string& key, Milliseconds timeout) { return inner_->get(prefixed(key), timeout); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return inner_->add(prefixed(key), delta); }
void PrefixStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  inner_->wait(prefixed(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(prefixed(keys)); }

}  // namespace loom::dist
