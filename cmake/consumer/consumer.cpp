// C++ consumer of the installed libmha (CMake: find_package(mha), mha::mha).
// One head, two queries, three keys; checks against a double-precision sum.
#include <mha.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main()
{
    const int L = 2, S = 3, d = 4;
    std::vector<float> q(L * d), k(S * d), v(S * d), out(L * d);
    for (int i = 0; i < L * d; i++) q[i] = 0.1f * float(i % 5) - 0.2f;
    for (int i = 0; i < S * d; i++) k[i] = 0.05f * float(i % 7) - 0.1f;
    for (int i = 0; i < S * d; i++) v[i] = 0.3f * float(i % 3) + 0.1f;

    mha_engine *engine = nullptr;
    if (mha_engine_create(nullptr, &engine) != MHA_OK) {
        std::fprintf(stderr, "engine: %s\n", mha_last_error());
        return 1;
    }
    mha_attention_args a{};
    a.q = mha_tensor_bshd(q.data(), 1, L, 1, d);
    a.k = mha_tensor_bshd(k.data(), 1, S, 1, d);
    a.v = mha_tensor_bshd(v.data(), 1, S, 1, d);
    a.out = mha_tensor_bshd(out.data(), 1, L, 1, d);
    mha_status st = mha_attention(engine, &a);
    if (st != MHA_OK) {
        std::fprintf(stderr, "%s: %s\n", mha_status_string(st), mha_last_error());
        return 1;
    }
    double worst = 0;
    for (int i = 0; i < L; i++) {
        double s[S], m = -INFINITY, z = 0;
        for (int j = 0; j < S; j++) {
            s[j] = 0;
            for (int c = 0; c < d; c++) s[j] += double(q[i * d + c]) * k[j * d + c];
            s[j] /= std::sqrt(double(d));
            m = std::fmax(m, s[j]);
        }
        for (int j = 0; j < S; j++) z += std::exp(s[j] - m);
        for (int c = 0; c < d; c++) {
            double o = 0;
            for (int j = 0; j < S; j++) o += std::exp(s[j] - m) / z * v[j * d + c];
            worst = std::fmax(worst, std::fabs(o - out[i * d + c]));
        }
    }
    std::printf("libmha %s (%s): max error %.2g\n", mha_version(),
                mha_isa_name(mha_engine_isa(engine)), worst);
    mha_engine_destroy(engine);
    return worst < 1e-5 ? 0 : 1;
}
