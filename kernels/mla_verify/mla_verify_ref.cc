#include "kernels/mla_verify/mla_verify_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/dtype.h"
#include "kernels/mla_verify/mla_verify_limits.h"

namespace probesidecar::kernels {
namespace {

constexpr int kDqk = kMlaHeadDimQk;
constexpr int kDv = kMlaHeadDimV;
constexpr int kPage = kMlaPageSize;

double Bf(uint16_t bits) { return static_cast<double>(common::Bf16ToFloat(bits)); }

}  // namespace

void ResizeMlaVerifyRefOutputs(const MlaVerifyRefInputs& in, MlaVerifyRefOutputs* o) {
  const size_t rows = static_cast<size_t>(in.batch) * in.s_q * in.h_q;
  o->out.assign(rows * kDv, 0.0);
  o->abs_weighted.assign(rows * kDv, 0.0);
  o->lse.assign(rows, 0.0);
}

void MlaVerifyReference(const MlaVerifyRefInputs& in, MlaVerifyRefOutputs* o, int32_t first,
                        int32_t last) {
  if (last < 0) last = in.batch;
  const size_t rows = static_cast<size_t>(in.batch) * in.s_q * in.h_q;
  if (o->out.size() != rows * kDv) ResizeMlaVerifyRefOutputs(in, o);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> qd(kDqk), acc(kDv), accabs(kDv), s(kPage);
  for (int32_t b = first; b < last; ++b) {
    const int32_t len = in.cache_seqlens[b];
    for (int32_t j = 0; j < in.s_q; ++j) {
      // Query j sees keys [0, last_key].
      const int64_t last_key = static_cast<int64_t>(len) - in.s_q + j;
      for (int32_t h = 0; h < in.h_q; ++h) {
        const uint16_t* qp =
            in.q + b * in.q_batch_stride + j * in.q_token_stride + h * in.q_head_stride;
        for (int d = 0; d < kDqk; ++d) qd[d] = Bf(qp[d]);
        double m = neg_inf, l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(accabs.begin(), accabs.end(), 0.0);
        for (int64_t k0 = 0; k0 <= last_key; k0 += kPage) {
          const int32_t page = in.block_table[b * in.block_table_batch_stride + k0 / kPage];
          const int n = static_cast<int>(std::min<int64_t>(kPage, last_key + 1 - k0));
          double mb = neg_inf;
          for (int i = 0; i < n; ++i) {
            const uint16_t* kp = in.kv_cache + page * in.kv_page_stride + i * in.kv_row_stride;
            double dot = 0.0;
            for (int d = 0; d < kDqk; ++d) dot += qd[d] * Bf(kp[d]);
            s[i] = dot * in.softmax_scale;
            mb = std::max(mb, s[i]);
          }
          const double m_new = std::max(m, mb);
          const double alpha = std::exp(m - m_new);  // m = -inf on the first page: 0
          l *= alpha;
          for (int d = 0; d < kDv; ++d) {
            acc[d] *= alpha;
            accabs[d] *= alpha;
          }
          for (int i = 0; i < n; ++i) {
            const double p = std::exp(s[i] - m_new);
            l += p;
            const uint16_t* vp = in.kv_cache + page * in.kv_page_stride + i * in.kv_row_stride;
            for (int d = 0; d < kDv; ++d) {
              const double v = Bf(vp[d]);
              acc[d] += p * v;
              accabs[d] += p * std::fabs(v);
            }
          }
          m = m_new;
        }
        const size_t row = (static_cast<size_t>(b) * in.s_q + j) * in.h_q + h;
        for (int d = 0; d < kDv; ++d) {
          o->out[row * kDv + d] = l > 0.0 ? acc[d] / l : 0.0;
          o->abs_weighted[row * kDv + d] = l > 0.0 ? accabs[d] / l : 0.0;
        }
        o->lse[(static_cast<size_t>(b) * in.h_q + h) * in.s_q + j] =
            l > 0.0 ? m + std::log(l) : neg_inf;
      }
    }
  }
}

void MlaCompareResult::AddFinite(int64_t i, double got, double want, double bound, double* num,
                                 double* den) {
  const double err = std::fabs(got - want);
  *num += err * err;
  *den += want * want;
  max_abs_err = std::max(max_abs_err, err);
  if (err > bound) ++bad;
  if (err / bound > max_err_over_bound) {
    max_err_over_bound = err / bound;
    worst_index = i;
  }
}

MlaCompareResult CompareMlaOutput(const float* got, const double* ref, const double* absw,
                                  int64_t n, double bound_scale) {
  MlaCompareResult r;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ++r.count;
    const double g = got[i];
    if (std::isnan(g) || std::isinf(g)) {
      ++r.nan;
      ++r.bad;
      if (r.worst_index < 0 || r.max_err_over_bound < std::numeric_limits<double>::infinity()) {
        r.max_err_over_bound = std::numeric_limits<double>::infinity();
        r.worst_index = i;
      }
      continue;
    }
    r.AddFinite(i, g, ref[i], bound_scale * (0.00390625 * (std::fabs(ref[i]) + absw[i]) + 1e-6),
                &num, &den);
  }
  r.rel_l2 = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return r;
}

MlaCompareResult CompareMlaLse(const float* got, const double* ref, int64_t n) {
  MlaCompareResult r;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ++r.count;
    const double g = got[i];
    if (std::isnan(g)) {
      ++r.nan;
      ++r.bad;
      r.max_err_over_bound = std::numeric_limits<double>::infinity();
      r.worst_index = i;
      continue;
    }
    if (std::isinf(ref[i]) || std::isinf(g)) {
      if (g != ref[i]) {
        ++r.bad;
        r.max_err_over_bound = std::numeric_limits<double>::infinity();
        r.worst_index = i;
      }
      continue;
    }
    r.AddFinite(i, g, ref[i], 1e-3 + 1e-5 * std::fabs(ref[i]), &num, &den);
  }
  r.rel_l2 = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return r;
}

}  // namespace probesidecar::kernels
