// A session lease (OpenSession): buffers registered under it are released by the server when the
// session ends — when this object is destroyed, or when the process exits.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"

namespace probesidecar::client {

class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Open(Client& client);
  ~Session();  // ends the session
  uint64_t id() const { return id_; }

 private:
  Session() = default;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> reader_;
  uint64_t id_ = 0;
};

}  // namespace probesidecar::client
