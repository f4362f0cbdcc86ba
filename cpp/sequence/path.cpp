// The tables of paths and engines, filled by static registrations before any
// call and only read after.
#include "cpp/sequence/path.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>

namespace lltm::sequence {
namespace {

constexpr size_t kDeviceTypes =
    static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

struct Tables {
  std::array<std::vector<const Path*>, kDeviceTypes> paths;
  std::array<const Engine*, kDeviceTypes> engines{};
};

Tables& tables() {
  static Tables t;
  return t;
}

size_t slot(c10::DeviceType device) {
  return static_cast<size_t>(device);
}

} // namespace

std::string Plan::name() const {
  return variant.empty() ? std::string(path->name)
                         : std::string(path->name) + "/" + variant;
}

c10::ArrayRef<const Path*> paths(c10::DeviceType device) {
  return tables().paths[slot(device)];
}

const Path* find_path(c10::DeviceType device, std::string_view name) {
  for (const Path* path : paths(device)) {
    if (name == path->name) {
      return path;
    }
  }
  return nullptr;
}

const Engine* engine(c10::DeviceType device) {
  return tables().engines[slot(device)];
}

PathRegistration::PathRegistration(const Path& path) {
  std::vector<const Path*>& table = tables().paths[slot(path.device)];
  TORCH_INTERNAL_ASSERT(
      find_path(path.device, path.name) == nullptr,
      "two sequence paths named ",
      path.name);
  const auto at = std::find_if(
      table.begin(), table.end(), [&](auto* p) { return p->rank > path.rank; });
  table.insert(at, &path);
}

EngineRegistration::EngineRegistration(const Engine& engine) {
  tables().engines[slot(engine.device)] = &engine;
}

} // namespace lltm::sequence
