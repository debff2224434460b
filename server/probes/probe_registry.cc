#include "server/probes/probe_registry.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/probes/open_beneath.h"

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

}  // namespace

ProbeRegistry::ProbeRegistry(std::string probes_dir, ProbeSetLimits limits, PrepareFn prepare)
    : probes_dir_(std::move(probes_dir)), limits_(limits), prepare_(std::move(prepare)) {}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::LoadFromPath(
    absl::string_view name, absl::string_view path, bool replace,
    ProbeSetOptions options) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  // Cheap refusal before reading what may be a large file; Publish checks again under the lock.
  if (!replace && Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
  }
  if (probes_dir_.empty()) {
    return absl::PermissionDeniedError(
        "loading probe sets from paths is disabled (the server has no probes directory)");
  }
  // Opened first, then read from the descriptor: what is read is what was checked.
  absl::StatusOr<BeneathFile> opened = OpenBeneath(probes_dir_, path);
  if (!opened.ok()) return WithContext(opened.status(), SetContext(name));
  absl::StatusOr<common::SafetensorsFile> file =
      common::SafetensorsFile::ReadFrom(opened->fd(), opened->path(), limits_.file);
  return Publish(name, std::move(file), opened->path(), replace, options);
}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::LoadFromBytes(
    absl::string_view name, std::string bytes, bool replace,
    ProbeSetOptions options) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  if (!replace && Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
  }
  return Publish(name, common::SafetensorsFile::Parse(std::move(bytes), limits_.file), "inline",
                 replace, options);
}

absl::StatusOr<std::shared_ptr<const ProbeSet>> ProbeRegistry::Publish(
    absl::string_view name, absl::StatusOr<common::SafetensorsFile> file, std::string source,
    bool replace, ProbeSetOptions options) {
  if (!file.ok()) return WithContext(file.status(), SetContext(name));
  absl::StatusOr<std::shared_ptr<ProbeSet>> set;
  {
    // The file's bytes are freed here, before the prepare hook allocates device memory.
    const common::SafetensorsFile parsed = *std::move(file);
    set = ProbeSetFromSafetensors(name, parsed, std::move(source), limits_);
  }
  if (!set.ok()) return WithContext(set.status(), SetContext(name));
  (*set)->precision = kernels::ResolveProbePrecision(options.precision, (*set)->num_probes);
  (*set)->count_outcomes = options.count_outcomes;
  // Checked before the prepare hook spends device memory, and again when publishing.
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status status = CheckCaps(name, **set); !status.ok()) return status;
  }
  if (prepare_) {
    absl::Status status = prepare_(**set);
    if (!status.ok()) return WithContext(status, SetContext(name));
  }
  std::shared_ptr<const ProbeSet> published = *std::move(set);
  std::shared_ptr<const ProbeSet> previous;  // released after the lock: it may free device memory
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status status = CheckCaps(name, *published); !status.ok()) return status;
    auto it = sets_.find(name);
    if (it != sets_.end()) {
      if (!replace) {
        return absl::AlreadyExistsError(
            absl::StrCat(SetContext(name), " is already loaded (set replace to swap it)"));
      }
      previous = std::exchange(it->second, published);
      total_bytes_ -= previous->weight_bytes();
    } else {
      sets_.emplace(std::string(name), published);
    }
    total_bytes_ += published->weight_bytes();
  }
  return published;
}

absl::Status ProbeRegistry::CheckCaps(absl::string_view name, const ProbeSet& set) const {
  auto it = sets_.find(name);
  const bool replacing = it != sets_.end();
  if (!replacing && sets_.size() >= limits_.max_sets) {
    return absl::ResourceExhaustedError(
        absl::StrCat(SetContext(name), ": ", sets_.size(),
                     " probe sets are loaded, the limit (unload one first)"));
  }
  const uint64_t after =
      total_bytes_ - (replacing ? it->second->weight_bytes() : 0) + set.weight_bytes();
  if (after > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(SetContext(name), ": its ", set.weight_bytes(),
                                                     " bytes of weights would bring the loaded "
                                                     "sets to ",
                                                     after, " bytes, over the limit of ",
                                                     limits_.max_total_bytes));
  }
  return absl::OkStatus();
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
    total_bytes_ -= removed->weight_bytes();
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

uint64_t ProbeRegistry::total_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return total_bytes_;
}

absl::StatusOr<std::vector<absl::Status>> ProbeRegistry::LoadDirectory(
    ProbeSetOptions options) {
  std::vector<absl::Status> failed;
  if (probes_dir_.empty()) return failed;
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
  for (const std::string& file : files) {
    const std::string name = file.substr(0, file.size() - kExtension.size());
    absl::StatusOr<std::shared_ptr<const ProbeSet>> loaded =
        LoadFromPath(name, file, /*replace=*/false, options);
    if (!loaded.ok()) {
      failed.push_back(
          WithContext(loaded.status(), absl::StrCat("loading ", common::QuoteForMessage(file))));
    }
  }
  return failed;
}

}  // namespace probesidecar::server
