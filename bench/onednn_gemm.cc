// Optional peer benchmark: oneDNN matmul GFLOP/s for the shapes `corelm bench gemm` measures, so
// both appear in the same run. Built only when oneDNN is installed (cmake/bench_onednn.cmake);
// the product never links it. Run one-threaded (OMP_NUM_THREADS=1 is set by corelm bench gemm).
//
//   onednn_gemm --shapes "M,K,N;M,K,N" [--seconds S]  ->  one JSON object on stdout
//
// The product is Y[M, N] = X[M, K] . W[N, K]^T (a linear layer, W in nn.Linear layout), fp32, and
// bf16 X/W with fp32 Y. Primitive creation and weight conversion are excluded, like the packing
// of corelm's linear_bf16.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace {

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best seconds per call over short batches (thread CPU clock: time given to other processes on
// a shared core is not counted), as in corelm bench gemm.
template <typename Fn>
double seconds_per_call(double seconds, Fn fn) {
  fn();
  double t0 = cpu_seconds();
  fn();
  const double once = std::max(1e-9, cpu_seconds() - t0);
  const long reps = std::max(1L, static_cast<long>(5e-4 / once));
  double best = 1e30, spent = 0;
  do {
    t0 = cpu_seconds();
    for (long r = 0; r < reps; ++r) fn();
    const double dt = cpu_seconds() - t0;
    spent += dt;
    best = std::min(best, dt / reps);
  } while (spent < seconds);
  return best;
}

double measure(dnnl::engine& eng, dnnl::stream& strm, long M, long K, long N, dnnl::memory::data_type in_type,
               double seconds) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::memory::desc src_md({M, K}, in_type, tag::ab);
  dnnl::memory::desc w_md({K, N}, in_type, tag::ba);  // W stored [N, K]: the transposed layout
  dnnl::memory::desc dst_md({M, N}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_md, dst_md), eng);
  dnnl::memory src(pd.src_desc(), eng), w(pd.weights_desc(), eng), dst(pd.dst_desc(), eng);
  std::memset(src.get_data_handle(), 0, pd.src_desc().get_size());
  std::memset(w.get_data_handle(), 0, pd.weights_desc().get_size());
  dnnl::matmul prim(pd);
  const double t = seconds_per_call(seconds, [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}});
    strm.wait();
  });
  return 2.0 * M * K * N / t * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes;
  double seconds = 0.3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shapes")) shapes = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  if (shapes.empty()) {
    std::fprintf(stderr, "usage: onednn_gemm --shapes \"M,K,N;...\" [--seconds S]\n");
    return 2;
  }
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl_version_t* v = dnnl_version();
  std::printf("{\"version\":\"oneDNN %d.%d.%d\",\"results\":[", v->major, v->minor, v->patch);
  std::stringstream in(shapes);
  std::string item;
  bool first = true;
  while (std::getline(in, item, ';')) {
    long M = 0, K = 0, N = 0;
    if (std::sscanf(item.c_str(), "%ld,%ld,%ld", &M, &K, &N) != 3 || M <= 0 || K <= 0 || N <= 0) continue;
    const double f32 = measure(eng, strm, M, K, N, dnnl::memory::data_type::f32, seconds);
    double bf16 = 0;
    try {
      bf16 = measure(eng, strm, M, K, N, dnnl::memory::data_type::bf16, seconds);
    } catch (const dnnl::error&) {
      bf16 = 0;  // no bf16 matmul on this CPU
    }
    std::printf("%s{\"M\":%ld,\"K\":%ld,\"N\":%ld,\"f32_gflops\":%.3f,\"bf16_gflops\":%.3f}", first ? "" : ",", M, K,
                N, f32, bf16);
    first = false;
  }
  std::printf("]}\n");
  return 0;
}
