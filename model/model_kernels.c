/*
 * model/model_kernels.c - which dense kernels the models run, made to fit
 * the CPU they run on, and checked before the first step.
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel set once,
 * when the library loads, from the CPU's family and model. A CPU newer than
 * the library (Debian 12's 0.3.21 on a Sapphire or Emerald Rapids Xeon, say)
 * is not in its table, and it falls back to its generic Prescott (SSE3)
 * kernels: sgemm at dlrm's layer shapes then runs at a quarter to a third of
 * what the same library does with its AVX-512 kernels on the same machine.
 * The only knob is OPENBLAS_CORETYPE, read by the library's constructor,
 * before main(). So a program that does dense math calls
 * model_kernels_ensure() first thing in main(): it compares the kernel set
 * the library chose with the best one the CPU can run (cpuid, and the
 * registers the OS saves: XGETBV), and when the library fell short and
 * nobody set OPENBLAS_CORETYPE, sets it and executes itself again (same
 * argv, same PID: under mpirun or srun this happens before MPI_Init, so the
 * launcher sees nothing). A core type in the environment is the user's
 * choice and is kept, with a warning when it leaves the CPU's vector units
 * unused. KILN_BLAS_OWN carries the library's own pick across the exec, so
 * that the log says what was changed, and stops a second exec if the
 * library ignored the setting.
 *
 * The same re-execution sets GOMP_SPINCOUNT=30000 where the environment
 * says nothing of how idle OpenMP threads wait (below).
 *
 * Some OpenBLAS builds compute wrong results on some CPUs (the reason a
 * machine sets OPENBLAS_CORETYPE at all), so the kernels are checked too:
 * model_kernels_check runs each GEMM a model makes, at its real shapes
 * (model_selfcheck), against a float64 reference, and names the first
 * product that disagrees.
 */
#define MODEL_IMPL
#include "model.h"

#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS's own declarations (openblas_config.h; not in every cblas.h). */
char *openblas_get_corename(void);
char *openblas_get_config(void);

#define ENV_OWN "KILN_BLAS_OWN"           /* the library's pick before Kiln's exec */
#define ENV_FALLBACK "KILN_BLAS_FALLBACK" /* why Kiln's pick was given up */

/* ---- OpenBLAS's kernel sets --------------------------------------------------------
 * The x86-64 core types of OpenBLAS's DYNAMIC_ARCH table by the widest
 * vector code their sgemm uses. A name not listed (a newer library's) is
 * trusted: it knows CPUs this table does not. */
static const struct {
    const char *name;
    model_isa_t isa;
} cores[] = {
    {"Katmai", MODEL_ISA_SSE},      {"Coppermine", MODEL_ISA_SSE}, {"Northwood", MODEL_ISA_SSE},
    {"Prescott", MODEL_ISA_SSE},    {"Banias", MODEL_ISA_SSE},     {"Atom", MODEL_ISA_SSE},
    {"Core2", MODEL_ISA_SSE},       {"Penryn", MODEL_ISA_SSE},     {"Dunnington", MODEL_ISA_SSE},
    {"Nehalem", MODEL_ISA_SSE},     {"Athlon", MODEL_ISA_SSE},     {"Opteron", MODEL_ISA_SSE},
    {"Barcelona", MODEL_ISA_SSE},   {"Bobcat", MODEL_ISA_SSE},     {"Nano", MODEL_ISA_SSE},
    {"Sandybridge", MODEL_ISA_AVX}, {"Bulldozer", MODEL_ISA_AVX},  {"Piledriver", MODEL_ISA_AVX},
    {"Steamroller", MODEL_ISA_AVX}, {"Excavator", MODEL_ISA_AVX},  {"Haswell", MODEL_ISA_AVX2},
    {"Zen", MODEL_ISA_AVX2},        {"SkylakeX", MODEL_ISA_AVX512}, {"Cooperlake", MODEL_ISA_AVX512},
    {"SapphireRapids", MODEL_ISA_AVX512},
};

int model_blas_core_isa(const char *core)
{
    for (size_t i = 0; core != NULL && i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(core, cores[i].name) == 0)
            return (int)cores[i].isa;
    return -1;
}

const char *model_blas_core_for(const model_cpu_t *c)
{
    switch (model_cpu_isa(c)) {
    case MODEL_ISA_AVX512:
        /* Cooperlake is SkylakeX's kernels plus bf16 ones (sbgemm). */
        return c->avx512_bf16 ? "Cooperlake" : "SkylakeX";
    case MODEL_ISA_AVX2:
        return "Haswell";
    case MODEL_ISA_AVX:
        return "Sandybridge";
    default:
        return NULL;
    }
}

const char *model_kernels_decide(const char *core, const model_cpu_t *cpu, const char *user_core,
                                 const char *own)
{
    if (own != NULL || (user_core != NULL && user_core[0] != '\0'))
        return NULL; /* Kiln set it already, or the user did */
    const char *best = model_blas_core_for(cpu);
    const int have = model_blas_core_isa(core);
    if (best == NULL || have < 0 || have >= (int)model_cpu_isa(cpu))
        return NULL;
    return best;
}

void model_kernels_describe(model_kernels_t *out)
{
    memset(out, 0, sizeof *out);
    model_cpu_detect(&out->cpu);
    const char *core = openblas_get_corename(), *cfg = openblas_get_config();
    snprintf(out->core, sizeof out->core, "%s", core ? core : "?");
    /* "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." -> "OpenBLAS 0.3.21" */
    int words = 0;
    size_t i = 0;
    for (; cfg != NULL && cfg[i] != '\0' && i + 1 < sizeof out->library; i++) {
        if (cfg[i] == ' ' && ++words == 2)
            break;
        out->library[i] = cfg[i];
    }
    if (i == 0)
        snprintf(out->library, sizeof out->library, "OpenBLAS");
    const char *own = getenv(ENV_OWN), *user = getenv("OPENBLAS_CORETYPE");
    if (own != NULL)
        snprintf(out->own, sizeof out->own, "%s", own);
    else if (user != NULL && user[0] != '\0')
        snprintf(out->user, sizeof out->user, "%s", user);
    const char *fb = getenv(ENV_FALLBACK);
    if (fb != NULL)
        snprintf(out->fallback, sizeof out->fallback, "%s", fb);
    const int isa = model_blas_core_isa(out->core);
    out->generic = isa >= 0 && isa < (int)model_cpu_isa(&out->cpu);
    snprintf(out->name, sizeof out->name, "%s %s", out->library, out->core);
}

/* One sentence for the run's log: what runs, what the CPU has, who chose. */
void model_kernels_sentence(const model_kernels_t *k, char *buf, size_t cap)
{
    char cpu[128];
    model_cpu_describe(&k->cpu, cpu, sizeof cpu);
    if (k->fallback[0] != '\0')
        snprintf(buf, cap,
                 "dense kernels: %s, the library's own pick: the %s kernels Kiln chose for this "
                 "CPU (%s) computed a wrong product (%s), so Kiln fell back",
                 k->name, model_blas_core_for(&k->cpu), cpu, k->fallback);
    else if (k->own[0] != '\0' && strcasecmp(k->own, k->core) != 0)
        snprintf(buf, cap,
                 "dense kernels: %s (chosen by Kiln: the library's own pick for this CPU, family "
                 "%d model %d with %s, was its generic %s)",
                 k->name, k->cpu.family, k->cpu.model, cpu, k->own);
    else if (k->user[0] != '\0' && k->generic)
        snprintf(buf, cap,
                 "dense kernels: %s, as OPENBLAS_CORETYPE=%s asks; this CPU (%s) could run the "
                 "wider vector code of %s: unset OPENBLAS_CORETYPE to let Kiln choose",
                 k->name, k->user, cpu, model_blas_core_for(&k->cpu));
    else if (k->user[0] != '\0')
        snprintf(buf, cap, "dense kernels: %s, as OPENBLAS_CORETYPE=%s asks (CPU: %s)", k->name,
                 k->user, cpu);
    else if (k->generic)
        snprintf(buf, cap,
                 "dense kernels: %s, generic kernels that leave this CPU's %s unused (Kiln's "
                 "switch to %s did not take: set OPENBLAS_CORETYPE=%s)",
                 k->name, cpu, model_blas_core_for(&k->cpu), model_blas_core_for(&k->cpu));
    else
        snprintf(buf, cap, "dense kernels: %s (the library's own pick; CPU: %s)", k->name, cpu);
}

/* Executes this program again with argv. Through its own path, not
 * /proc/self/exe: the kernel names a process after the file it executed, and
 * "exe" in ps, top, pkill and Open MPI's messages hides kiln-train. The link
 * itself only where the path is gone (the binary was replaced meanwhile).
 * Returns only on failure (errno set). */
static void exec_self(char *const argv[])
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    execv("/proc/self/exe", argv);
}

/* Re-executes with OPENBLAS_CORETYPE=core (NULL: unchanged). Returns only
 * on failure. */
static int reexec(char *const argv[], const char *core)
{
    if (core != NULL && setenv("OPENBLAS_CORETYPE", core, 1) != 0)
        return KILN_ENOMEM;
    exec_self(argv);
    return KILN_EIO;
}

/* dlrm's default layers (bottom 13-64-16, top 367-256-128-1) as the models
 * call them, in 256-row blocks: the check of a kernel set Kiln chose, before
 * MPI starts (model_selfcheck checks a model's own shapes later). */
static int check_defaults(void)
{
    static const int layers[][2] = {{13, 64}, {64, 16}, {367, 256}, {256, 128}, {128, 1}};
    model_gemm_shape_t s[4 * sizeof layers / sizeof layers[0]];
    int n = 0;
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        const int in = layers[l][0], out = layers[l][1];
        s[n++] = (model_gemm_shape_t){"forward", 256, out, in, false, true, false};
        s[n++] = (model_gemm_shape_t){"input gradient", 256, in, out, false, false, false};
        s[n++] = (model_gemm_shape_t){"weight gradient", out, in, 256, true, false, false};
        s[n++] = (model_gemm_shape_t){"weight gradient", out, in, 256, true, false, true};
    }
    return model_kernels_check(s, n);
}

/* ---- how idle OpenMP threads wait ---------------------------------------------------
 * libgomp's default lets a worker that reaches a barrier spin for 300,000
 * rounds (milliseconds) before it sleeps, whenever the team is no larger
 * than the cores. A Kiln rank is rarely alone on its cores (its reader
 * thread, MPI, a kiln-serve or kilnd beside it, other jobs), and a spinning
 * worker holds the core that the thread it waits for needs. Sleeping at
 * once (OMP_WAIT_POLICY=passive) costs a wake-up at every parallel region
 * instead. Measured on 2 cores (docs/benchmarks.md, session 12), samples/s
 * with two other busy processes on the machine: lr 0.22 M spinning the
 * default, 0.47 M with 30,000 rounds, 0.60 M passive; dlrm 27 k, 45 k,
 * 59 k. On a quiet machine: dlrm 121 k, 126 k, 104 k; lr and fm within the
 * noise of each other. So Kiln spins briefly (GOMP_SPINCOUNT=30000, tens of
 * microseconds), unless the environment says how to wait (OMP_WAIT_POLICY
 * or GOMP_SPINCOUNT): libgomp reads them as it loads, so this too takes the
 * re-execution below. */
#define KILN_SPINCOUNT "30000"

static bool wait_policy_unset(void)
{
    return getenv("OMP_WAIT_POLICY") == NULL && getenv("GOMP_SPINCOUNT") == NULL;
}

bool model_threads_spin(void)
{
    const char *w = getenv("OMP_WAIT_POLICY"), *n = getenv("GOMP_SPINCOUNT");
    if (n != NULL)
        return atol(n) != 0;
    return w == NULL || strcasecmp(w, "passive") != 0;
}

void model_threads_wait(char *buf, size_t cap)
{
    const char *w = getenv("OMP_WAIT_POLICY"), *n = getenv("GOMP_SPINCOUNT");
    if (n != NULL)
        snprintf(buf, cap, "GOMP_SPINCOUNT=%s", n);
    else if (w != NULL)
        snprintf(buf, cap, "OMP_WAIT_POLICY=%s", w);
    else
        snprintf(buf, cap, "libgomp's default");
}

int model_kernels_ensure(char *const argv[])
{
    model_cpu_t cpu;
    model_cpu_detect(&cpu);
    const char *core = openblas_get_corename();
    const char *own = getenv(ENV_OWN), *user = getenv("OPENBLAS_CORETYPE");
    if (own != NULL && getenv(ENV_FALLBACK) == NULL && check_defaults() < 0) {
        /* Kiln's pick computes wrong products here: back to the library's. */
        if (setenv(ENV_FALLBACK, kiln_errmsg(), 1) != 0)
            return KILN_ENOMEM;
        reexec(argv, own);
        return kiln_errf(KILN_EIO, "cannot re-execute with OPENBLAS_CORETYPE=%s (%s)", own,
                         strerror(errno));
    }
    const char *best = model_kernels_decide(core, &cpu, user, own);
    const bool wait = wait_policy_unset();
    if (best == NULL && !wait)
        return 0;
    if (wait && setenv("GOMP_SPINCOUNT", KILN_SPINCOUNT, 1) != 0)
        return KILN_ENOMEM;
    if (best != NULL && setenv(ENV_OWN, core, 1) != 0)
        return kiln_errf(KILN_ENOMEM, "cannot set OPENBLAS_CORETYPE=%s", best);
    reexec(argv, best);
    /* Still here: run as the environment was, and say so (result.json's
     * openmp_wait reads GOMP_SPINCOUNT, so it must not stay set unread). */
    const int err = errno;
    if (wait)
        unsetenv("GOMP_SPINCOUNT");
    if (best == NULL)
        return kiln_errf(KILN_EIO,
                         "cannot re-execute with GOMP_SPINCOUNT=%s (%s): idle OpenMP threads "
                         "spin for milliseconds; set GOMP_SPINCOUNT=%s in the environment",
                         KILN_SPINCOUNT, strerror(err), KILN_SPINCOUNT);
    unsetenv("OPENBLAS_CORETYPE");
    return kiln_errf(KILN_EIO,
                     "cannot re-execute with OPENBLAS_CORETYPE=%s (%s): the dense math runs "
                     "OpenBLAS's generic %s kernels; set OPENBLAS_CORETYPE=%s in the environment",
                     best, strerror(err), core, best);
}

/* ---- the check ------------------------------------------------------------------------ */

/* Fills n floats with values in [-1, 1) from a fixed sequence. */
static void fill(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)(s >> 40) * (1.0f / 8388608.0f) - 1.0f;
    }
}

/* Checks C (m, n) = op(A) op(B) of one sgemm or dgemm call (as the models
 * make it, row-major) against a float64 reference: each element within 16
 * float32 ulps of the sum of |terms| (an honest float32 GEMM is far inside;
 * a wrong kernel is far outside). Returns 0, or KILN_ECORRUPT with the
 * element in why. */
static int check_one(const model_gemm_shape_t *s, float *A, float *B, float *C, double *Ad,
                     double *Bd, double *Cd)
{
    const int m = s->m, n = s->n, k = s->k;
    const size_t na = (size_t)m * (size_t)k, nb = (size_t)k * (size_t)n, nc = (size_t)m * n;
    fill(A, na, (uint64_t)(m * 31 + k));
    fill(B, nb, (uint64_t)(n * 17 + k));
    /* A is stored (m, k) or, transposed, (k, m); B (k, n) or (n, k). */
    const int lda = s->ta ? m : k, ldb = s->tb ? k : n;
    if (s->dbl) {
        for (size_t i = 0; i < na; i++)
            Ad[i] = A[i];
        for (size_t i = 0; i < nb; i++)
            Bd[i] = B[i];
        cblas_dgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, Ad, lda, Bd, ldb, 0.0, Cd, n);
    } else {
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, n);
    }
    const double ulp = s->dbl ? 0x1p-52 : 0x1p-23;
    /* Every element of the first and last 4 rows (where edge tiles go
     * wrong) and of every 29th row between (29 is prime: it meets every
     * offset of a kernel's row tile): the check stays a few milliseconds of
     * a start-up, and well under a second in a sanitizer build. */
    for (size_t idx = 0; idx < nc; idx++) {
        const int i = (int)(idx / (size_t)n), j = (int)(idx % (size_t)n);
        if (i >= 4 && i < m - 4 && i % 29 != 0)
            continue;
        double ref = 0.0, mag = 0.0;
        for (int p = 0; p < k; p++) {
            const double a = s->ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
            const double b = s->tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
            ref += a * b;
            mag += fabs(a * b);
        }
        const double got = s->dbl ? Cd[idx] : (double)C[idx];
        if (!(fabs(got - ref) <= 16.0 * ulp * mag + 1e-30))
            return kiln_errf(KILN_ECORRUPT,
                             "%s: %cgemm %dx%dx%d%s%s gives %.9g at (%d, %d) where a float64 "
                             "reference gives %.9g",
                             s->what, s->dbl ? 'd' : 's', m, n, k, s->ta ? " A^T" : "",
                             s->tb ? " B^T" : "", got, i, j, ref);
    }
    return 0;
}

int model_kernels_check(const model_gemm_shape_t *shapes, int nshapes)
{
    size_t ca = 1, cb = 1, cc = 1;
    for (int i = 0; i < nshapes; i++) {
        const size_t m = (size_t)shapes[i].m, n = (size_t)shapes[i].n, k = (size_t)shapes[i].k;
        ca = m * k > ca ? m * k : ca;
        cb = k * n > cb ? k * n : cb;
        cc = m * n > cc ? m * n : cc;
    }
    float *A = malloc(ca * sizeof *A), *B = malloc(cb * sizeof *B), *C = malloc(cc * sizeof *C);
    double *Ad = malloc(ca * sizeof *Ad), *Bd = malloc(cb * sizeof *Bd),
           *Cd = malloc(cc * sizeof *Cd);
    int rc = (A && B && C && Ad && Bd && Cd) ? 0 : KILN_ENOMEM;
    for (int i = 0; rc == 0 && i < nshapes; i++)
        if (shapes[i].m > 0 && shapes[i].n > 0 && shapes[i].k > 0)
            rc = check_one(&shapes[i], A, B, C, Ad, Bd, Cd);
    KILN_FREE_ALL(A, B, C, Ad, Bd, Cd);
    return rc;
}
