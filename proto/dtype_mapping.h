// The API's element types (v1::DType) and the project's (common/dtype.h): one table, both ways,
// for the server and the clients alike. Header-only.
#pragma once

#include <optional>

#include "common/dtype.h"
#include "probesidecar/v1/tensor.pb.h"

namespace probesidecar {

struct DTypeMapping {
  v1::DType proto;
  common::DType dtype;
};

inline constexpr DTypeMapping kDTypeMappings[] = {
    {v1::DTYPE_FLOAT32, common::DType::kFloat32},
    {v1::DTYPE_FLOAT16, common::DType::kFloat16},
    {v1::DTYPE_BFLOAT16, common::DType::kBFloat16},
};

// nullopt for DTYPE_UNSPECIFIED or a value no float type of the API has.
inline std::optional<common::DType> DTypeFromProto(v1::DType proto) {
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.proto == proto) return m.dtype;
  }
  return std::nullopt;
}

inline v1::DType DTypeToProto(common::DType dtype) {
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.dtype == dtype) return m.proto;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace probesidecar
