/*
 * model/model_cpu.c - what the CPU runs: cpuid's vector extensions that the
 * OS also saves the registers of (XGETBV), and whether it multiplies bf16
 * in hardware. In kiln_model_shape (no BLAS), so that kiln submit can
 * refuse model.dense_precision: bf16 on a host that cannot run it as
 * kiln-train does (docs/models.md, "Dense precision").
 */
#include "kiln.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HAVE_CPUID 1
#endif

/* ---- the CPU -------------------------------------------------------------------- */

#ifdef HAVE_CPUID
static unsigned long long xgetbv0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

void model_cpu_detect(model_cpu_t *out)
{
    memset(out, 0, sizeof *out);
#ifdef HAVE_CPUID
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    out->family = (int)((a >> 8) & 0xf) + ((((a >> 8) & 0xf) == 0xf) ? (int)((a >> 20) & 0xff) : 0);
    out->model = (int)(((a >> 4) & 0xf) | (((a >> 16) & 0xf) << 4));
    const bool osxsave = (c >> 27) & 1;
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    /* The OS must save the registers, not only the CPU have them. */
    const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
    const bool tiles = (xcr0 & 0x60000) == 0x60000;
    out->avx = ymm && ((c >> 28) & 1);
    out->fma = ymm && ((c >> 12) & 1);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        out->avx2 = ymm && ((b >> 5) & 1);
        out->avx512f = zmm && ((b >> 16) & 1);
        out->avx512dq = zmm && ((b >> 17) & 1);
        out->avx512bw = zmm && ((b >> 30) & 1);
        out->avx512vl = zmm && ((b >> 31) & 1);
        out->amx_bf16 = tiles && ((d >> 22) & 1) && ((d >> 24) & 1);
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
            out->avx512_bf16 = zmm && ((a >> 5) & 1);
    }
#endif
}

model_isa_t model_cpu_isa(const model_cpu_t *c)
{
    if (c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq)
        return MODEL_ISA_AVX512;
    if (c->avx2 && c->fma)
        return MODEL_ISA_AVX2;
    if (c->avx)
        return MODEL_ISA_AVX;
    return MODEL_ISA_SSE;
}

void model_cpu_describe(const model_cpu_t *c, char *buf, size_t cap)
{
    static const struct {
        size_t off;
        const char *name;
    } flags[] = {
        {offsetof(model_cpu_t, avx), "AVX"},
        {offsetof(model_cpu_t, avx2), "AVX2"},
        {offsetof(model_cpu_t, fma), "FMA"},
        {offsetof(model_cpu_t, avx512f), "AVX-512F"},
        {offsetof(model_cpu_t, avx512_bf16), "AVX512_BF16"},
        {offsetof(model_cpu_t, amx_bf16), "AMX-BF16"},
    };
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!*(const bool *)((const char *)c + flags[i].off))
            continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? " " : "", flags[i].name);
        if (w < 0 || (size_t)w >= cap - len)
            break;
        len += (size_t)w;
    }
    if (len == 0)
        snprintf(buf, cap, "SSE only");
}

/* ---- bf16 ------------------------------------------------------------------------ */

int model_bf16_check(const model_cpu_t *cpu)
{
    if (cpu->avx512_bf16 || cpu->amx_bf16)
        return 0;
    char feats[128];
    model_cpu_describe(cpu, feats, sizeof feats);
    return kiln_errf(KILN_EINVAL,
                     "model.dense_precision: bf16 needs a CPU that multiplies bf16 in hardware "
                     "(AVX512_BF16 or AMX-BF16), and this one (family %d model %d: %s) has "
                     "neither, so bf16 would run emulated, slower than fp32; set "
                     "model.dense_precision: fp32 (the default), or run the job on a Cooper Lake, "
                     "Sapphire Rapids or newer Xeon, or an AMD Zen 4 or newer",
                     cpu->family, cpu->model, feats);
}

/* oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) at or above the first with bf16
 * instructions; a cap not listed (SSE41 ... AVX512_CORE_VNNI) keeps oneDNN
 * below them, and it would emulate bf16. */
static const char *const bf16_caps[] = {"AVX512_CORE_BF16", "AVX512_CORE_FP16",
                                        "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                                        "AVX2_VNNI_2", "ALL", "DEFAULT"};

int model_bf16_check_here(void)
{
    static const char *const vars[] = {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"};
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
        const char *cap = getenv(vars[v]);
        if (cap == NULL || cap[0] == '\0')
            continue;
        for (size_t i = 0; i < sizeof bf16_caps / sizeof bf16_caps[0]; i++)
            if (strcasecmp(cap, bf16_caps[i]) == 0)
                goto cpu;
        return kiln_errf(KILN_EINVAL,
                         "model.dense_precision: bf16 needs oneDNN's bf16 instructions, and "
                         "%s=%s keeps it below them (it would emulate bf16, slower than "
                         "fp32); unset %s, or set model.dense_precision: fp32 (the default)",
                         vars[v], cap, vars[v]);
    }
cpu:;
    model_cpu_t cpu;
    model_cpu_detect(&cpu);
    return model_bf16_check(&cpu);
}
