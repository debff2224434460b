#include "server/probes/probe_registry.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace probesidecar::server {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kExtension = ".safetensors";

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string SetContext(absl::string_view name) { return absl::StrCat("probe set \"", name, "\""); }

absl::Status FilesystemError(const std::error_code& ec, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", ec.message());
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
    return absl::NotFoundError(message);
  }
  if (ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted) {
    return absl::PermissionDeniedError(message);
  }
  if (ec == std::errc::too_many_symbolic_link_levels || ec == std::errc::filename_too_long) {
    return absl::InvalidArgumentError(message);
  }
  return absl::UnknownError(message);
}

// True when `path` is `dir` or below it; both are canonical (absolute, no "." or "..", no
// symlinks). Compares whole components, so "/p/probes2" is not inside "/p/probes".
bool IsWithin(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (const fs::path& part : dir) {
    if (p == path.end() || *p != part) return false;
    ++p;
  }
  return true;
}

// Resolves `path` (relative to `probes_dir`, or absolute) through every symlink and "..", and
// refuses it unless the result stays inside the resolved probes_dir. A missing file inside is
// returned as is (the read answers NOT_FOUND); a missing file outside is PERMISSION_DENIED, so that
// nothing about the rest of the filesystem leaks.
absl::StatusOr<std::string> ResolveInside(const std::string& probes_dir, absl::string_view path) {
  if (probes_dir.empty()) {
    return absl::PermissionDeniedError(
        "loading probe sets from paths is disabled (the server has no probes directory)");
  }
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  std::error_code ec;
  const fs::path base = fs::canonical(probes_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("probes directory \"", probes_dir, "\" cannot be resolved: ", ec.message()));
  }
  const fs::path requested{std::string(path)};
  const fs::path candidate = requested.is_absolute() ? requested : base / requested;
  fs::path resolved = fs::weakly_canonical(candidate, ec);
  if (ec) return FilesystemError(ec, absl::StrCat("path \"", path, "\""));
  // weakly_canonical leaves a dangling symlink as it is (its target does not exist yet); open()
  // would follow it, so follow it here too and hold its target to the same rule.
  for (int hops = 0;; ++hops) {
    if (!IsWithin(resolved, base)) {
      return absl::PermissionDeniedError(
          absl::StrCat("path \"", path, "\" is outside the probes directory"));
    }
    if (!fs::is_symlink(fs::symlink_status(resolved, ec))) break;
    if (hops == 40) {
      return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\": too many symlinks"));
    }
    fs::path target = fs::read_symlink(resolved, ec);
    if (ec) return FilesystemError(ec, absl::StrCat("path \"", path, "\""));
    if (target.is_relative()) target = resolved.parent_path() / target;
    resolved = fs::weakly_canonical(target, ec);
    if (ec) return FilesystemError(ec, absl::StrCat("path \"", path, "\""));
  }
  return resolved.string();
}

}  // namespace

ProbeRegistry::ProbeRegistry(std::string probes_dir, ProbeSetLimits limits, PrepareFn prepare)
    : probes_dir_(std::move(probes_dir)), limits_(limits), prepare_(std::move(prepare)) {}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::LoadFromPath(absl::string_view name,
                                                                            absl::string_view path,
                                                                            bool replace) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  // Cheap refusal before reading what may be a large file; Publish checks again under the lock.
  if (!replace && Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
  }
  absl::StatusOr<std::string> resolved = ResolveInside(probes_dir_, path);
  if (!resolved.ok()) return WithContext(resolved.status(), SetContext(name));
  absl::StatusOr<common::SafetensorsFile> file =
      common::SafetensorsFile::Read(*resolved, limits_.file);
  return Publish(name, std::move(file), *resolved, replace);
}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::LoadFromBytes(absl::string_view name,
                                                                             std::string bytes,
                                                                             bool replace) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  if (!replace && Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
  }
  return Publish(name, common::SafetensorsFile::Parse(std::move(bytes), limits_.file), "inline",
                 replace);
}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::Publish(
    absl::string_view name, absl::StatusOr<common::SafetensorsFile> file, std::string source,
    bool replace) {
  if (!file.ok()) return WithContext(file.status(), SetContext(name));
  absl::StatusOr<std::shared_ptr<ProbeSet>> set;
  {
    // The file's bytes are freed here, before the prepare hook allocates device memory.
    const common::SafetensorsFile parsed = *std::move(file);
    set = ProbeSetFromSafetensors(name, parsed, std::move(source), limits_);
  }
  if (!set.ok()) return WithContext(set.status(), SetContext(name));
  if (prepare_) {
    absl::Status status = prepare_(**set);
    if (!status.ok()) return WithContext(status, SetContext(name));
  }
  std::shared_ptr<const ProbeSet> published = *std::move(set);
  std::shared_ptr<const ProbeSet> previous;  // released after the lock: it may free device memory
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(name);
    if (it != sets_.end()) {
      if (!replace) {
        return absl::AlreadyExistsError(
            absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
      }
      previous = std::exchange(it->second, published);
    } else {
      sets_.emplace(std::string(name), published);
    }
  }
  return published;
}

absl::Status ProbeRegistry::Unload(absl::string_view name) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  std::shared_ptr<const ProbeSet> removed;  // released after the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(name);
    if (it == sets_.end()) {
      return absl::NotFoundError(absl::StrCat(SetContext(name), " is not loaded"));
    }
    removed = std::move(it->second);
    sets_.erase(it);
  }
  return absl::OkStatus();
}

std::shared_ptr<const ProbeSet> ProbeRegistry::Find(absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sets_.find(name);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const ProbeSet>> ProbeRegistry::List() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::shared_ptr<const ProbeSet>> out;
  out.reserve(sets_.size());
  for (const auto& [name, set] : sets_) out.push_back(set);
  return out;
}

size_t ProbeRegistry::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return sets_.size();
}

absl::Status ProbeRegistry::LoadDirectory() {
  if (probes_dir_.empty()) return absl::OkStatus();
  std::error_code ec;
  fs::directory_iterator it(probes_dir_, ec);
  if (ec) return FilesystemError(ec, absl::StrCat("probes directory \"", probes_dir_, "\""));
  std::vector<std::string> files;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.size() > kExtension.size() && file.ends_with(kExtension)) files.push_back(file);
  }
  if (ec) return FilesystemError(ec, absl::StrCat("probes directory \"", probes_dir_, "\""));
  std::sort(files.begin(), files.end());
  absl::Status first_error;
  for (const std::string& file : files) {
    const std::string name = file.substr(0, file.size() - kExtension.size());
    absl::StatusOr<std::shared_ptr<const ProbeSet>> loaded =
        LoadFromPath(name, file, /*replace=*/false);
    if (!loaded.ok() && first_error.ok()) {
      first_error = WithContext(loaded.status(), absl::StrCat("loading \"", file, "\""));
    }
  }
  return first_error;
}

}  // namespace probesidecar::server
