// Google Benchmark driver: registers one case per (kind, shape, ISA, thread
// count) and calls only the C shim. Counters: GFLOPS (attention FLOPs
// 4*B*H*Lq*Lk*d, dense-equivalent under a causal mask, plus the projections
// for the layer) and, for decode, GBPS (K and V bytes read per second).
// References measured in the same run: fma_peak/<isa> (GFLOPS of multiply-add
// chains) and membw/read (GBPS of a summing loop over 1 GiB, more than the
// last-level cache: the read bandwidth decode is held to).
//
// Own flags (the rest are Google Benchmark's):
//   --threads=1,2,4    thread counts (default 1, 2, 4, ... and the core count)
//   --isa=generic,avx2 ISAs to run, of those this build and CPU support
//   --no-self-check    skip comparing the BLAS baseline with mha_attention
//   --no-warmup        time a case's first call too (see CurrentCase)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shim.h"

#ifndef MHA_BENCH_BUILDTYPE
#define MHA_BENCH_BUILDTYPE "unknown"
#endif

namespace {

struct Shape {
    const char *kind;
    int64_t b, h, hkv, lq, lk, d;
    mha_dtype kv = MHA_F32; // K and V elements (decode)
    bench_layout layout = BENCH_LAYOUT_BSHD; // BHSD: the name ends _BHSD
};

// The cases of the issue. The layer's E is H * d.
const Shape kShapes[] = {
    {"attention", 1, 8, 8, 512, 512, 64},
    {"attention", 1, 16, 16, 2048, 2048, 64},
    {"attention", 1, 32, 32, 1024, 1024, 128},
    {"attention", 4, 12, 12, 512, 512, 64},
    {"causal", 1, 16, 16, 2048, 2048, 64},
    // ALiBi (BLOOM's and MPT's slopes) on the causal case of its shape:
    // the slope times the distance puts most scores of the steep heads
    // 87 to 300 below their maxima, where an exp left subnormal P (x86
    // computes on those through microcode assists; docs/benchmarks.md).
    {"alibi", 1, 16, 16, 2048, 2048, 64},
    // Gemma 2's softcap of 50 on the causal case of its shape: the cost of
    // a tanh a score (docs/design.md, "Score terms").
    {"softcap", 1, 16, 16, 2048, 2048, 64},
    // A sliding window (causal, kWindowLeft keys to the left) beside the
    // plain causal case of its shape: its cost grows with Lq x window.
    {"window", 1, 16, 16, 8192, 8192, 64},
    {"causal", 1, 16, 16, 8192, 8192, 64},
    {"decode", 1, 32, 32, 1, 4096, 128},
    {"decode", 8, 32, 32, 1, 2048, 128},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_F16},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_I8},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_FP8_E4M3},
    {"decode", 1, 32, 8, 1, 8192, 128},
    {"decode", 1, 1, 1, 1, 32768, 128},
    // 16 query heads a kv head (Llama 3.1 405B, Qwen3-235B): more rows
    // than a decode block takes, so the prefill stream's; its [B, H, L, D]
    // twin with the other _BHSD rows below.
    {"decode", 1, 128, 8, 1, 4096, 128},
    {"layer", 1, 8, 8, 512, 512, 64},
    {"layer", 1, 16, 16, 2048, 2048, 64},
    // Serving (mha_attention_varlen): a paged cache of 16-key blocks in
    // shuffled order beside the same decode on a contiguous [B, L, H, D]
    // cache; a continuous batch of eight causal prompts (64 to 2048 tokens)
    // in one call beside one call per prompt (lq, lk: the longest).
    {"decode", 8, 32, 8, 1, 4096, 128},
    {"paged", 8, 32, 8, 1, 4096, 128},
    {"decode", 8, 32, 8, 1, 4096, 128, MHA_F16},
    {"paged", 8, 32, 8, 1, 4096, 128, MHA_F16},
    // The quantised caches paged (per-row scales), beside their contiguous
    // rows and the fp32 ones above.
    {"decode", 8, 32, 8, 1, 4096, 128, MHA_I8},
    {"paged", 8, 32, 8, 1, 4096, 128, MHA_I8},
    {"decode", 8, 32, 8, 1, 4096, 128, MHA_FP8_E4M3},
    {"paged", 8, 32, 8, 1, 4096, 128, MHA_FP8_E4M3},
    // The paged form of the quantised-cache shape (one kv head per query
    // head), read against the fp32 paged row of that shape.
    {"paged", 1, 32, 32, 1, 4096, 128},
    {"paged", 1, 32, 32, 1, 4096, 128, MHA_I8},
    {"paged", 1, 32, 32, 1, 4096, 128, MHA_FP8_E4M3},
    // Its 16-bit forms: a paged cache of [B, L, H, D] rows read against
    // the contiguous and the [B, H, L, D] decode of the same K/V dtype.
    {"paged", 1, 32, 32, 1, 4096, 128, MHA_F16},
    {"paged", 1, 32, 32, 1, 4096, 128, MHA_BF16},
    {"varlen", 8, 32, 8, 2048, 2048, 128},
    {"varlen_seq", 8, 32, 8, 2048, 2048, 128},
    // The bf16 (fp16) compute dtype (q and out bf16) of a bf16 model: a
    // kind of its own, read against the fp32 case of the shape; the
    // fp32-compute decode of the same bf16 cache beside it.
    {"attention_bf16", 1, 16, 16, 2048, 2048, 64, MHA_BF16},
    {"attention_bf16", 1, 32, 32, 1024, 1024, 128, MHA_BF16},
    {"attention_f16", 1, 32, 32, 1024, 1024, 128, MHA_F16},
    // The layer of a bf16 model (weights rounded to bf16 at creation).
    {"layer_bf16", 1, 8, 8, 512, 512, 64, MHA_BF16},
    {"layer_bf16", 1, 16, 16, 2048, 2048, 64, MHA_BF16},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_BF16},
    {"decode_bf16", 1, 32, 32, 1, 4096, 128, MHA_BF16},
    // The decode shapes from a [B, H, L, D] cache: the unsuffixed rows
    // ([B, L, H, D]) are read against these.
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_F32, BENCH_LAYOUT_BHSD},
    {"decode", 8, 32, 32, 1, 2048, 128, MHA_F32, BENCH_LAYOUT_BHSD},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_F16, BENCH_LAYOUT_BHSD},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_BF16, BENCH_LAYOUT_BHSD},
    {"decode", 8, 32, 32, 1, 2048, 128, MHA_F16},
    {"decode", 8, 32, 32, 1, 2048, 128, MHA_F16, BENCH_LAYOUT_BHSD},
    {"decode", 8, 32, 32, 1, 2048, 128, MHA_BF16},
    {"decode", 8, 32, 32, 1, 2048, 128, MHA_BF16, BENCH_LAYOUT_BHSD},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_I8, BENCH_LAYOUT_BHSD},
    {"decode", 1, 32, 32, 1, 4096, 128, MHA_FP8_E4M3, BENCH_LAYOUT_BHSD},
    {"decode", 1, 128, 8, 1, 4096, 128, MHA_F32, BENCH_LAYOUT_BHSD},
    // A speculative decode step: 4 queries a sequence, bottom-right
    // causal (every decode row with Lq > 1 is), from both layouts; from
    // [B, L, H, D] its blocks interleave the queries of several kv heads.
    {"decode", 1, 32, 32, 4, 4096, 128},
    {"decode", 1, 32, 32, 4, 4096, 128, MHA_F32, BENCH_LAYOUT_BHSD},
};

// The compute dtype of a kind: "<kind>_bf16" and "<kind>_f16" are half.
mha_dtype ComputeOf(const char *kind)
{
    const size_t n = std::strlen(kind);
    if (n > 5 && std::strcmp(kind + n - 5, "_bf16") == 0)
        return MHA_BF16;
    if (n > 4 && std::strcmp(kind + n - 4, "_f16") == 0)
        return MHA_F16;
    return MHA_F32;
}

// Keys per block of the paged cases.
constexpr int64_t kPagedBlock = 16;

bool IsVarlen(const char *kind)
{
    return std::strncmp(kind, "varlen", 6) == 0;
}

// The "softcap" case's cap (Gemma 2's attention logits).
constexpr float kSoftcap = 50.0f;

// Keys to the left of the diagonal a "window" case sees.
constexpr int64_t kWindowLeft = 1024;

// Steps of the peak microkernel per call: a few milliseconds on one core.
constexpr int64_t kPeakIterations = int64_t{1} << 21;

std::string ShapeName(const Shape &s)
{
    char buf[128];
    if (IsVarlen(s.kind)) {
        std::snprintf(buf, sizeof buf, "B%lld_H%lld_KV%lld_D%lld_L%lld-%lld",
                      static_cast<long long>(s.b), static_cast<long long>(s.h),
                      static_cast<long long>(s.hkv),
                      static_cast<long long>(s.d),
                      static_cast<long long>(bench_varlen_length(0)),
                      static_cast<long long>(
                          bench_varlen_length(BENCH_VARLEN_SEQS - 1)));
        return buf;
    }
    std::snprintf(buf, sizeof buf, "B%lld_H%lld_KV%lld_Lq%lld_Lk%lld_D%lld",
                  static_cast<long long>(s.b), static_cast<long long>(s.h),
                  static_cast<long long>(s.hkv), static_cast<long long>(s.lq),
                  static_cast<long long>(s.lk), static_cast<long long>(s.d));
    const char *suffix = s.kv == MHA_F16        ? "_F16"
                         : s.kv == MHA_BF16     ? "_BF16"
                         : s.kv == MHA_I8       ? "_I8"
                         : s.kv == MHA_FP8_E4M3 ? "_FP8_E4M3"
                         : s.kv == MHA_FP8_E5M2 ? "_FP8_E5M2"
                                                : "";
    return buf + std::string(suffix) +
           (s.layout == BENCH_LAYOUT_BHSD ? "_BHSD" : "");
}

// The case being measured. Google Benchmark calls a case's function once per
// repetition (the first one more often, to size the iteration count).
// Keeping the inputs until another case runs spares the setup (up to 0.5 GB
// of random data) when repetitions run in order, and holds one case in memory
// at a time when they are interleaved. The setup is never timed.
//
// Nor is a new case's first call (unless --no-warmup): it allocates and
// faults in the workspace the engine and a layer keep for the calls that
// follow (34 MiB for the layer at E = 1024, L = 2048, where the kernel's
// huge-page faults made a first call up to 15% slower). A server pays that
// once; interleaved repetitions would pay it in every sample of a case
// whose call outlasts min_time.
bool warmup = true;

class CurrentCase {
  public:
    ~CurrentCase() { bench_case_destroy(case_); }
    bench_case *Get(const std::string &name, const bench_spec &spec)
    {
        if (name != name_) {
            bench_case_destroy(case_);
            case_ = nullptr;
            name_.clear();
            case_ = bench_case_create(&spec);
            if (case_ != nullptr && warmup && bench_case_run(case_) != 0) {
                bench_case_destroy(case_);
                case_ = nullptr;
            }
            if (case_ != nullptr)
                name_ = name;
        }
        return case_;
    }

  private:
    std::string name_;
    bench_case *case_ = nullptr;
};

CurrentCase current;

using Clock = std::chrono::steady_clock;

// Rates come from our own wall clock: the calls run on an OpenMP team, so
// the main thread's CPU time is not the elapsed time, and UseRealTime()
// would append "/real_time" to the names.
double SecondsPerIteration(const benchmark::State &state, Clock::time_point t0)
{
    const std::chrono::duration<double> elapsed = Clock::now() - t0;
    const double iterations = static_cast<double>(state.iterations());
    return iterations > 0 ? elapsed.count() / iterations : 0.0;
}

void RunCase(benchmark::State &state, const std::string &name,
             const bench_spec &spec, bool decode)
{
    bench_case *c = current.Get(name, spec);
    if (c == nullptr) {
        state.SkipWithError(bench_error());
        return;
    }
    const auto t0 = Clock::now();
    for (auto _ : state) {
        if (bench_case_run(c) != 0) {
            state.SkipWithError(bench_error());
            break;
        }
    }
    const double seconds = SecondsPerIteration(state, t0);
    if (seconds <= 0.0)
        return;
    state.counters["GFLOPS"] = bench_spec_flops(&spec) / seconds * 1e-9;
    if (decode)
        state.counters["GBPS"] = bench_spec_kv_bytes(&spec) / seconds * 1e-9;
    if (spec.causal != MHA_CAUSAL_NONE)
        state.SetLabel("dense-equivalent");
}

void RunPeak(benchmark::State &state, mha_isa isa, int threads)
{
    double flops = 0.0;
    const auto t0 = Clock::now();
    for (auto _ : state) {
        flops = bench_fma_peak_run(isa, threads, kPeakIterations);
        if (flops < 0.0) {
            state.SkipWithError("no peak microkernel for this ISA");
            break;
        }
    }
    const double seconds = SecondsPerIteration(state, t0);
    if (seconds > 0.0 && flops > 0.0)
        state.counters["GFLOPS"] = flops / seconds * 1e-9;
}

// One pass over the bandwidth buffer per iteration (about 0.1 s on one core).
void RunMembw(benchmark::State &state, int threads)
{
    // The allocation and first touch (about 0.5 s) stay out of the timing.
    if (bench_membw_prepare(threads) != 0) {
        state.SkipWithError(bench_error());
        return;
    }
    double bytes = 0.0;
    const auto t0 = Clock::now();
    for (auto _ : state) {
        bytes = bench_membw_run(threads);
        if (bytes < 0.0) {
            state.SkipWithError(bench_error());
            break;
        }
    }
    const double seconds = SecondsPerIteration(state, t0);
    if (seconds > 0.0 && bytes > 0.0)
        state.counters["GBPS"] = bytes / seconds * 1e-9;
}

std::vector<int> DefaultThreads()
{
    const int cores = bench_core_count();
    std::vector<int> out;
    for (int t = 1; t < cores; t *= 2)
        out.push_back(t);
    out.push_back(cores > 0 ? cores : 1);
    return out;
}

// "1,2,4" -> {1, 2, 4}; false on anything else.
bool ParseThreads(const char *list, std::vector<int> *out)
{
    out->clear();
    const char *p = list;
    while (*p != '\0') {
        char *end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p || t <= 0 || t > 4096)
            return false;
        out->push_back(static_cast<int>(t));
        p = end;
        if (*p == ',')
            ++p;
        else if (*p != '\0')
            return false;
    }
    return !out->empty();
}

// Every ISA the library knows, best first (mha_isas' order, which the
// report reads back from the "isas" context to find MHA_ISA_AUTO's table).
std::vector<mha_isa> AllIsas()
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    return std::vector<mha_isa>(all, all + n);
}

bool ParseIsas(const char *list, std::vector<mha_isa> *out)
{
    out->clear();
    std::string rest = list;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string name = rest.substr(0, comma);
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        mha_isa isa = MHA_ISA_AUTO;
        if (mha_isa_from_name(name.c_str(), &isa) != MHA_OK ||
            isa == MHA_ISA_AUTO)
            return false;
        out->push_back(isa);
    }
    return !out->empty();
}

std::string Join(const std::vector<std::string> &items)
{
    std::string out;
    for (const std::string &s : items)
        out += (out.empty() ? "" : ",") + s;
    return out;
}

bool IsLayer(const Shape &s)
{
    return std::strncmp(s.kind, "layer", 5) == 0 &&
           (s.kind[5] == '\0' || s.kind[5] == '_');
}

// The OpenBLAS baseline: each attention, causal and decode shape once,
// without a mask (the causal case is compared with the dense baseline of its
// shape, as a user without libmha computes the whole S and then masks it).
std::vector<Shape> BaselineShapes()
{
    std::vector<Shape> out;
    if (!bench_have_blas())
        return out;
    for (const Shape &s : kShapes) {
        // The baseline computes in fp32 only, and its whole S of a
        // window-length shape would not fit the cache of any machine.
        bool seen = IsLayer(s) || s.kv != MHA_F32 || s.lq > 4096 ||
                    IsVarlen(s.kind) || std::strcmp(s.kind, "paged") == 0;
        for (const Shape &o : out)
            seen = seen || ShapeName(o) == ShapeName(s);
        if (!seen) {
            out.push_back(s);
            out.back().kind = "blas_baseline";
        }
    }
    return out;
}

// "<kind>/<shape>,..." in registration order: the report keeps this order
// when the repetitions ran interleaved.
std::string CaseOrder()
{
    std::vector<std::string> order;
    for (const Shape &s : kShapes)
        order.push_back(std::string(s.kind) + "/" + ShapeName(s));
    for (const Shape &s : BaselineShapes())
        order.push_back(std::string(s.kind) + "/" + ShapeName(s));
    return Join(order);
}

bench_spec MakeSpec(const Shape &s, mha_isa isa, int threads)
{
    bench_spec spec{};
    spec.impl = IsLayer(s) ? BENCH_IMPL_LAYER
                : std::strcmp(s.kind, "blas_baseline") == 0 ? BENCH_IMPL_BLAS
                : std::strcmp(s.kind, "paged") == 0         ? BENCH_IMPL_PAGED
                : std::strcmp(s.kind, "varlen") == 0        ? BENCH_IMPL_VARLEN
                : std::strcmp(s.kind, "varlen_seq") == 0
                    ? BENCH_IMPL_VARLEN_SEQ
                    : BENCH_IMPL_ATTENTION;
    spec.paged_block = kPagedBlock;
    spec.batch = s.b;
    spec.heads = s.h;
    spec.kv_heads = s.hkv;
    spec.lq = s.lq;
    spec.lk = s.lk;
    spec.d = s.d;
    const bool window = std::strcmp(s.kind, "window") == 0;
    const bool spec_step = std::strncmp(s.kind, "decode", 6) == 0 && s.lq > 1;
    const bool alibi = std::strcmp(s.kind, "alibi") == 0;
    const bool softcap = std::strcmp(s.kind, "softcap") == 0;
    spec.causal = std::strcmp(s.kind, "causal") == 0 || window || alibi ||
                          softcap ||
                          IsVarlen(s.kind) || spec_step
                      ? MHA_CAUSAL_BOTTOM_RIGHT
                      : MHA_CAUSAL_NONE;
    spec.window_left = window ? kWindowLeft : 0;
    spec.alibi = alibi;
    spec.softcap = softcap ? kSoftcap : 0.0f;
    spec.layout = s.layout;
    spec.kv_dtype = s.kv;
    spec.compute = ComputeOf(s.kind);
    spec.isa = isa;
    spec.threads = threads;
    return spec;
}

// One case per thread count; isa_name is the ISA's or "openblas".
void RegisterShape(const Shape &s, mha_isa isa, const char *isa_name,
                   const std::vector<int> &threads)
{
    for (int t : threads) {
        const std::string name = std::string(s.kind) + "/" + ShapeName(s) +
                                 "/" + isa_name + "/threads:" +
                                 std::to_string(t);
        const bench_spec spec = MakeSpec(s, isa, t);
        const bool decode =
            s.lq == 1 || std::strncmp(s.kind, "decode", 6) == 0;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [name, spec, decode](benchmark::State &st) {
                                         RunCase(st, name, spec, decode);
                                     })
            ->Unit(benchmark::kMillisecond);
    }
}

void RegisterAll(const std::vector<mha_isa> &isas,
                 const std::vector<int> &threads)
{
    for (mha_isa isa : isas) {
        for (int t : threads) {
            const std::string name = std::string("fma_peak/") +
                                     mha_isa_name(isa) + "/threads:" +
                                     std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(),
                                         [isa, t](benchmark::State &st) {
                                             RunPeak(st, isa, t);
                                         })
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (int t : threads) {
        const std::string name = "membw/read/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), [t](benchmark::State &st) {
            RunMembw(st, t);
        })->Unit(benchmark::kMillisecond);
    }
    for (const Shape &s : kShapes) {
        for (mha_isa isa : isas)
            RegisterShape(s, isa, mha_isa_name(isa), threads);
    }
    for (const Shape &s : BaselineShapes())
        RegisterShape(s, MHA_ISA_GENERIC, "openblas", threads);
}

}  // namespace

int main(int argc, char **argv)
{
    benchmark::Initialize(&argc, argv);
    std::vector<int> threads = DefaultThreads();
    std::vector<mha_isa> wanted = AllIsas();
    bool self_check = true;
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        bool ok = true;
        if (std::strncmp(arg, "--threads=", 10) == 0)
            ok = ParseThreads(arg + 10, &threads);
        else if (std::strncmp(arg, "--isa=", 6) == 0)
            ok = ParseIsas(arg + 6, &wanted);
        else if (std::strcmp(arg, "--no-self-check") == 0)
            self_check = false;
        else if (std::strcmp(arg, "--no-warmup") == 0)
            warmup = false;
        else
            ok = false;
        if (!ok) {
            std::vector<std::string> names;
            for (mha_isa isa : AllIsas())
                names.push_back(mha_isa_name(isa));
            std::fprintf(stderr,
                         "mha_bench: bad argument '%s'\n"
                         "own flags: --threads=1,2,4 --isa=%s "
                         "--no-self-check --no-warmup\n",
                         arg, Join(names).c_str());
            return 2;
        }
    }

    std::vector<mha_isa> isas;
    std::vector<std::string> isa_names, thread_names;
    for (mha_isa isa : wanted) {
        if (bench_isa_supported(isa)) {
            isas.push_back(isa);
            isa_names.push_back(mha_isa_name(isa));
        }
    }
    if (isas.empty()) {
        std::fprintf(stderr, "mha_bench: none of the requested ISAs runs here\n");
        return 2;
    }
    for (int t : threads)
        thread_names.push_back(std::to_string(t));

    if (self_check) {
        if (bench_self_check() != 0) {
            std::fprintf(stderr, "mha_bench: %s\n", bench_error());
            return 1;
        }
        if (bench_have_blas())
            std::fprintf(stderr, "mha_bench: self-check passed: the BLAS "
                                 "baseline agrees with mha_attention\n");
    }

    benchmark::AddCustomContext("cpu_model", bench_cpu_model());
    benchmark::AddCustomContext("libmha_version", mha_version());
    benchmark::AddCustomContext("libmha_buildtype", MHA_BENCH_BUILDTYPE);
    benchmark::AddCustomContext("isas", Join(isa_names));
    benchmark::AddCustomContext("threads", Join(thread_names));
    benchmark::AddCustomContext("blas_baseline",
                                bench_have_blas() ? "openblas" : "absent");
    benchmark::AddCustomContext(
        "flops", "4*B*H*Lq*Lk*d (causal: dense-equivalent); layer adds "
                 "4*B*E*E*(Lq+Lk)");
    benchmark::AddCustomContext(
        "membw", "bytes read per second by a summing loop over 1 GiB");
    benchmark::AddCustomContext("case_order", CaseOrder());
    RegisterAll(isas, threads);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
