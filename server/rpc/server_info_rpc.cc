// ServerInfo: answered inline, on the gRPC thread, from what every part can report without
// waiting (the executor's counters are atomics; the registries take short locks).
#include <memory>
#include <string>
#include <vector>

#include "server/ipc/buffer_registry.h"
#include "server/config/version.h"
#include "server/rpc/outcome_report.h"
#include "server/rpc/proto_conversion.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {
namespace {

void FillGraphCacheStats(const GraphCacheCounters& graphs, v1::GraphCacheStats* stats) {
  stats->set_entries(graphs.entries);
  stats->set_capacity(graphs.capacity);
  stats->set_hits(graphs.hits);
  stats->set_misses(graphs.misses);
  stats->set_captures(graphs.captures);
  stats->set_evictions(graphs.evictions);
}

}  // namespace

grpc::ServerUnaryReactor* ProbeSidecarService::ServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::ServerInfoRequest* /*request*/,
                                                          v1::ServerInfoResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kServerInfo);
  response->set_version(kVersion);
  response->set_git_commit(kGitCommit);
  const ExecutorInfo& executor = env_.executor->info();
  response->set_backend(executor.backend);
  response->set_device_name(executor.device_name);
  const ExecutorStats stats = env_.executor->stats();
  response->set_device_id(stats.devices.empty() ? env_.config.device
                                                : stats.devices.front().device);
  for (const DeviceReport& report : stats.devices) {
    v1::DeviceInfo* info = response->add_devices();
    info->set_device_id(report.device);
    info->set_name(report.name);
    info->set_compute_capability(report.compute_capability);
    for (const std::string& path : report.kernel_paths) info->add_kernel_paths(path);
    info->set_memory_bytes(report.memory_bytes);
    info->set_healthy(report.failure.empty());
    info->set_failure(report.failure);
    info->set_queued_requests(report.queued);
    info->set_gpu_requests(report.gpu_requests);
    FillGraphCacheStats(report.graph_cache, info->mutable_graph_cache());
    if (env_.ipc != nullptr) {
      info->set_registered_buffers(
          static_cast<uint32_t>(env_.ipc->buffers.counters(report.device).registrations));
      info->set_registered_events(static_cast<uint32_t>(env_.ipc->events.size(report.device)));
    }
  }
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(env_.config.max_message_bytes);
  limits->set_max_concurrent_requests(env_.config.max_concurrent_requests);
  limits->set_max_rows(env_.config.max_rows);
  limits->set_max_probes(env_.config.max_probes);
  limits->set_max_probe_file_bytes(env_.config.max_probe_file_bytes);
  limits->set_max_queued_requests(env_.config.max_queued_requests);
  limits->set_max_probe_sets(env_.config.max_probe_sets);
  limits->set_max_probe_set_bytes(env_.config.max_probe_set_bytes);
  limits->set_max_session_buffer_bytes(env_.config.max_session_buffer_bytes);
  limits->set_max_session_label_sets(env_.config.max_session_label_sets);
  limits->set_max_probe_labels(env_.config.max_probe_labels);
  for (const std::string& label : env_.config.session_labels) response->add_session_labels(label);
  for (const std::shared_ptr<const ProbeSet>& set : env_.probes->List()) {
    v1::ProbeSetInfo* info = response->add_probe_sets();
    FillProbeSetInfo(*set, info);
    FillProbeOutcomes(*set, env_.executor->OutcomeCounts(*set), *env_.outcome_labels, info);
  }
  // The outcomes above are all of the last copy from the devices (no gRPC thread waits for one):
  // the next is asked for only after they are read, as ListProbeSets does.
  env_.executor->ReadStats({OutcomeCopy::kAsk});
  FillGraphCacheStats(stats.graph_cache, response->mutable_graph_cache());
  response->set_uptime_seconds(SecondsSince(started_));
  if (env_.ipc != nullptr) {
    response->set_registered_buffers(
        static_cast<uint32_t>(env_.ipc->buffers.counters().registrations));
  }
  {
    absl::MutexLock lock(&listening_mu_);
    for (const std::string& address : listening_) response->add_listen(address);
  }
  response->set_metrics_listen(env_.metrics_listening);
  response->set_cuda_runtime(kCudaRuntime);
  response->set_mps(stats.mps);
  response->set_queued_requests(stats.queued);
  response->set_gpu_requests(stats.gpu_requests);
  response->set_compute_capability(executor.compute_capability);
  for (const std::string& path : executor.kernel_paths) response->add_kernel_paths(path);
  return Answer(context, Rpc::kServerInfo, start, absl::OkStatus());
}

}  // namespace probesidecar::server
