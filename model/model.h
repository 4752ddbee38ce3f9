/*
 * model/model.h - the dense side of kiln-train's models (lr, fm, dlrm):
 * forward to logits and probabilities, the logistic loss, backward to the
 * pooled embeddings and to the dense weights, the dense optimizer (sgd,
 * adagrad, adam), deterministic initialisation, checkpoint state, and the
 * eval metrics (exact AUC, logloss). Internal to the trainer and its tools; docs/models.md
 * has the formulas.
 *
 * The contract with the trainer loop, per step of one rank:
 *
 *   E  (n, S, d) float32  the POOLED embeddings: row i, categorical slot s,
 *                         d floats (d = model_table_dim(type, spec dim)).
 *                         The sparse side (tables, lookups, sharding) makes it.
 *   X  (n, F)    float32  the dense features, already log1p'd (F = 13 for
 *                         Criteo); may be NULL when F == 0.
 *   y  (n)       float32  labels, 0 or 1.
 *
 *   model_forward(m, n, E, X, y, probs, &loss_sum)  saves what backward needs
 *   model_backward(m, loss_scale, dE)               dE (n, S, d); ACCUMULATES
 *                                                      into model_grads(m)
 *   MPI_Allreduce(SUM) of model_grads(m), nparams DOUBLES   (the trainer)
 *   model_step(m); model_zero_grad(m);
 *
 * Gradients are sums over rows, and a float32 sum depends on its order:
 * 1 rank with 2B rows and 2 ranks with B rows each would add the same terms
 * in a different order, and adagrad (whose first steps are about lr * sign(g))
 * turns the last-bit differences of a near-cancelling sum into visible weight
 * differences. So every sum over rows (the weight GEMMs, the bias sums) runs
 * in float64 and the gradient buffer is float64: the sum is then exact to far
 * below float32's resolution whatever its order or split, and the optimizer
 * reads it rounded to float32 once, after the allreduce. Per-row products
 * run in fixed blocks of MODEL_ROW_BLOCK rows (model_blas.c). The result is
 * that 1 and N ranks on the same global batches train the same weights,
 * bit for bit when every rank's batch_size is a multiple of MODEL_ROW_BLOCK
 * and either a multiple of MODEL_GRAD_BLOCK in every run compared or in none
 * (model_blas.c; docs/models.md, "Rank-count invariance").
 *
 * Loss scaling for data parallelism: backward differentiates
 * loss_scale * sum_i loss_i over the local rows, so with loss_scale =
 * 1 / global_batch (the sum of n over all ranks) the allreduce SUM of the
 * ranks' gradients is exactly the gradient of the global mean loss, and dE
 * is already scaled the same way for the sparse update.
 *
 * All arrays are float32, row-major, C-contiguous. Everything a step needs
 * is allocated once by model_create for max_batch rows; forward, backward
 * and step allocate nothing. A model is not thread-safe (one per rank); the
 * calls use OpenMP threads inside: the GEMMs run as fixed 16-row blocks
 * spread over the OpenMP team, one single-threaded OpenBLAS call per block
 * (model_blas.c), and model_create sets OpenBLAS to one thread
 * (openblas_set_num_threads(1)) so that its own pool never spins beside the
 * team on the same cores.
 */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MODEL_LR = 0, MODEL_FM = 1, MODEL_DLRM = 2 } model_type_t;

/* model.dense_precision: what dlrm's MLP GEMMs multiply in. fp32 is
 * OpenBLAS's float32 SGEMM; bf16 rounds both operands to bfloat16 and
 * multiplies them with oneDNN's matmul, accumulating and writing float32
 * (model_bf16.c). Parameters, gradients and optimizer state are float32 or
 * wider either way, so checkpoints do not depend on it. lr and fm have no
 * MLP: model_create refuses bf16 for them. */
typedef enum { MODEL_DENSE_FP32 = 0, MODEL_DENSE_BF16 = 1 } model_dense_precision_t;

/* The dense optimizer, of kern.h's kinds (one enum for both optimizers);
 * same formulas as the sparse one in kernels/kern_ops.h,
 * with coupled L2 weight decay (g += weight_decay * w before the update, on
 * every dense parameter, biases included):
 *   sgd:     w -= lr * g
 *   adagrad: a += g^2;  w -= lr * g / (sqrt(a) + eps);  a starts at
 *            initial_accumulator
 *   adam:    t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *            w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)       */
typedef struct {
    kern_opt_kind_t type;
    float lr;
    float eps;                 /* adagrad, adam */
    float beta1, beta2;        /* adam, each in [0, 1) */
    float weight_decay;        /* >= 0 */
    float initial_accumulator; /* adagrad, >= 0 */
} model_dense_opt_t;

#define MODEL_MAX_LAYERS 16

typedef struct {
    model_type_t type;
    int nslots; /* S >= 0, categorical slots (26 for Criteo) */
    int ndense; /* F >= 0, dense features (13 for Criteo) */
    int dim;    /* d, floats per pooled vector: model_table_dim(type, spec dim);
                   lr: 1; fm: 1 + k (k >= 0 factors); dlrm: >= 1 */
    /* dlrm only: layer widths (copied). bottom: F -> bottom[0] -> ... ->
     * bottom[nbottom-1] == d, ReLU after every layer; top: (d + S(S+1)/2) ->
     * top[0] -> ... -> top[ntop-1] == 1 (the logit), ReLU between layers.
     * 1 <= nbottom, ntop <= MODEL_MAX_LAYERS. */
    const int *bottom;
    int nbottom;
    const int *top;
    int ntop;
    /* fm only: nonzero also projects X to k factors u = Vx x (a (k, F)
     * weight) that join the pairwise interaction as one more slot; zero
     * lets X enter the logit only linearly (w . x). */
    int fm_dense_factors;
    int max_batch; /* >= 1, largest n any call will pass */
    uint64_t seed; /* dense init; the same seed gives bit-identical weights */
    model_dense_opt_t opt;
    model_dense_precision_t precision; /* dlrm only; bf16 needs model_bf16_check */
} model_config_t;

typedef struct model model_t;

/* A named slice of the flat parameter vector: a (rows, cols) row-major
 * matrix; a layer's weight is (out, in), its bias (out, 1). docs/models.md
 * lists the layout of each model. */
typedef struct {
    char name[32]; /* "w", "b", "vx", "bottom.0.weight", "top.2.bias", ... */
    size_t offset; /* floats from the start of params / grads */
    int rows, cols;
} model_group_t;

/* A named float array of the checkpoint state (a view into the model). */
typedef struct {
    const char *name; /* "dense.params", "dense.adagrad_acc", "dense.adam_m", "dense.adam_v" */
    float *data;
    size_t count;
} model_array_t;

#define MODEL_MAX_STATE 3

/* Returns the embedding width d the tables must have for a model of this
 * type whose spec says model.embedding.dim = spec_dim: lr 1, fm spec_dim + 1
 * (element 0 is the slot's linear weight, 1..k the factor), dlrm spec_dim.
 * Returns KILN_EINVAL for an unknown type or spec_dim < 1 (fm, dlrm). */
int model_table_dim(model_type_t type, int spec_dim);

/* Returns "lr", "fm", "dlrm" (or "?"). */
const char *model_type_name(model_type_t type);
/* Returns "fp32", "bf16" (or "?"): the spec's spelling. */
const char *model_precision_name(model_dense_precision_t p);

/* Creates a model: checks the config (the message names the bad field),
 * allocates parameters, gradients (zeroed), optimizer state and every
 * workspace for cfg->max_batch rows, and initialises the weights from
 * cfg->seed. Returns 0, KILN_EINVAL or KILN_ENOMEM. Free with
 * model_destroy. */
int model_create(const model_config_t *cfg, model_t **out /* OUT */);
/* Frees m and everything it owns. Accepts NULL. */
void model_destroy(model_t *m);

/* The flat dense parameter vector (nparams floats) and its gradient, owned
 * by m: a double-double sum (kernels/kern_ops.h), nparams doubles of high
 * parts and nparams of low parts; the value is hi + lo. The trainer
 * allreduces the pairs (shard_comm_allreduce_sum_dd) and may broadcast
 * model_params. A bf16 model rounds its weights again at the next
 * forward after model_params was called (the caller may have written);
 * model_params_read is the same vector for reading only, and does not. */
size_t model_nparams(const model_t *m);
float *model_params(model_t *m);
const float *model_params_read(const model_t *m);
double *model_grads(model_t *m);
double *model_grads_lo(model_t *m);
/* The parameter groups in layout order (0 <= i < ngroups); NULL out of range. */
int model_ngroups(const model_t *m);
const model_group_t *model_group(const model_t *m, int i);

/* What a model was created as: the sizes of its inputs and what it computes. */
typedef struct {
    model_type_t type;
    model_dense_precision_t precision;
    int nslots;    /* S, categorical slots */
    int ndense;    /* F, dense features */
    int dim;       /* d, floats per pooled vector */
    int max_batch; /* the largest n a call may pass */
} model_info_t;

/* Returns m's type, precision and sizes (as its config gave them). */
model_info_t model_info(const model_t *m);

/* Sets every gradient to 0. */
void model_zero_grad(model_t *m);

/* Forward for n rows (0 <= n <= max_batch): E (n, S, d), X (n, F), y (n).
 * Writes the probabilities sigmoid(logit) to probs (n; may be NULL) and the
 * UNSCALED sum over the n rows of the logistic loss to *loss_sum (may be NULL;
 * then y may be NULL). Saves the activations and BORROWS E, X and y: they
 * must stay unchanged until model_backward. Returns 0 or KILN_EINVAL
 * (bad n, NULL input). */
int model_forward(model_t *m, int n, const float *E, const float *X, const float *y,
                     float *probs /* OUT (n), may be NULL */,
                     double *loss_sum /* OUT, may be NULL */);

/* Backward of loss_scale * sum_i loss_i for the rows of the last forward,
 * once per forward (that forward needed y). Writes dE (n, S, d), overwriting
 * it (dE may be the E given to forward: the gradient then replaces the
 * embeddings), and ADDS the dense gradients to model_grads. Returns 0 or
 * KILN_ESTATE when no forward with labels came before (or a backward or
 * predict came between). */
int model_backward(model_t *m, float loss_scale, float *dE /* OUT (n, S, d) */);

/* One dense optimizer update of the parameters from model_grads (after
 * the trainer's allreduce), each gradient rounded to float32 first. Does not
 * zero the gradients. Returns 0. */
int model_step(model_t *m);

/* Forward for eval and serving: probs (n) only, nothing kept for backward
 * (a following model_backward fails with KILN_ESTATE). Returns 0 or
 * KILN_EINVAL. */
int model_predict(model_t *m, int n, const float *E, const float *X,
                     float *probs /* OUT (n) */);

/* Checkpoint state: views of the model's own arrays, "dense.params" first,
 * then the optimizer's ("dense.adagrad_acc" | "dense.adam_m",
 * "dense.adam_v"), each nparams floats. Writing through the views changes
 * the model. *step is the optimizer's update count (adam's t). */
void model_state(model_t *m, model_array_t arrays[MODEL_MAX_STATE] /* OUT */,
                    int *narrays /* OUT */, int64_t *step /* OUT */);

/* Loads checkpoint state by name: "dense.params" is required; optimizer
 * arrays the model uses are loaded when present and reset to their initial
 * value (step 0) when absent (a checkpoint written without optimizer state,
 * or with another optimizer); other names are ignored. Returns 0, or
 * KILN_ECONFLICT when a size differs (the model's shape changed since the
 * checkpoint) or KILN_ENOENT without "dense.params". */
int model_load_arrays(model_t *m, const model_array_t *arrays, int narrays, int64_t step);

/* ---- loss and metrics ------------------------------------------------------------ */

/* Numerically stable sigmoid(z) = 1 / (1 + exp(-z)). */
float model_sigmoid(float z);
/* Numerically stable logistic loss of logit z with label y in [0, 1]:
 * max(z, 0) - z y + log1p(exp(-|z|)). */
double model_logloss(double z, double y);

/* Exact ROC AUC of scores against labels (> 0.5 is positive) over n rows,
 * by sorting, with ties given their average rank (a tie between a positive
 * and a negative counts one half). *auc is NaN when only one class occurs.
 * Returns 0 or KILN_ENOMEM. */
int model_metrics_auc(const float *scores, const float *labels, size_t n, double *auc /* OUT */);

/* Mean logloss of probabilities against labels, probabilities clamped to
 * [1e-7, 1 - 1e-7]. Returns 0 for n == 0. */
double model_metrics_logloss(const float *probs, const float *labels, size_t n);

/* ---- the dense kernels (model_kernels.c) -------------------------------------------
 * Which BLAS kernels the models run, fitted to the CPU and checked. */

/* The widest vector code a CPU runs with its OS's support (cpuid + XGETBV). */
typedef enum {
    MODEL_ISA_SSE = 1,    /* SSE3 and below: OpenBLAS's generic Prescott kernels */
    MODEL_ISA_AVX = 2,    /* Sandybridge */
    MODEL_ISA_AVX2 = 3,   /* AVX2 + FMA: Haswell */
    MODEL_ISA_AVX512 = 4, /* F, BW, VL, DQ: SkylakeX (Cooperlake with AVX512_BF16) */
} model_isa_t;

typedef struct {
    int family, model; /* cpuid's display family and model */
    bool avx, fma, avx2, avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, amx_bf16;
} model_cpu_t;

/* Reads this CPU's features (all false off x86). */
void model_cpu_detect(model_cpu_t *out /* OUT */);
model_isa_t model_cpu_isa(const model_cpu_t *c);
/* "AVX AVX2 FMA AVX-512F AVX512_BF16" into buf. */
void model_cpu_describe(const model_cpu_t *c, char *buf, size_t cap);
/* The ISA level of an OpenBLAS core type name (case-insensitive), or -1 for
 * a name Kiln does not know (a newer library's: trusted). */
int model_blas_core_isa(const char *core);
/* The OpenBLAS core type that runs this CPU's widest vector code, or NULL
 * (SSE only: nothing better to ask for). */
const char *model_blas_core_for(const model_cpu_t *c);
/* The core type to re-execute with, or NULL to keep the library's choice:
 * core is what the library runs, user_core the environment's
 * OPENBLAS_CORETYPE (NULL or "" when unset: a set one is the user's choice
 * and kept), own non-NULL when Kiln re-executed already. */
const char *model_kernels_decide(const char *core, const model_cpu_t *cpu, const char *user_core,
                                 const char *own);
/* Called first thing in main() of a program that does dense math, with its
 * argv: when OpenBLAS runs kernels below what the CPU offers and nobody set
 * OPENBLAS_CORETYPE, sets it and executes /proc/self/exe again with argv
 * (no return). Returns 0 when nothing needs doing, or an error (the exec
 * failed; the program may go on with the library's kernels, and should say
 * so with kiln_errmsg()). */
int model_kernels_ensure(char *const argv[]);
/* Also before the first parallel region: when neither OMP_WAIT_POLICY nor
 * GOMP_SPINCOUNT is set, model_kernels_ensure sets GOMP_SPINCOUNT=30000 for
 * the re-execution (idle OpenMP workers spin tens of microseconds, then
 * sleep, instead of holding for milliseconds the cores that the reader and
 * other processes need). True when this process's idle workers spin at all
 * (not OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0). */
bool model_threads_spin(void);
/* How idle workers wait, for result.json: "GOMP_SPINCOUNT=30000",
 * "OMP_WAIT_POLICY=passive", ..., or "libgomp's default". */
void model_threads_wait(char *buf, size_t cap);

/* What the dense math runs on, for the log and result.json. */
typedef struct {
    char library[32]; /* "OpenBLAS 0.3.21" */
    char core[32];    /* the core type running: "Cooperlake" */
    char name[64];    /* "OpenBLAS 0.3.21 Cooperlake": result.json's dense_kernels */
    char own[32];     /* the library's own pick when Kiln changed it, else "" */
    char user[32];    /* OPENBLAS_CORETYPE as the user set it, else "" */
    char fallback[256]; /* why Kiln's pick was given up (a wrong product), else "" */
    bool generic;     /* the kernels run below what the CPU offers */
    model_cpu_t cpu;
} model_kernels_t;
void model_kernels_describe(model_kernels_t *out /* OUT */);
/* One sentence for the log: the kernels, the CPU, who chose them. */
void model_kernels_sentence(const model_kernels_t *k, char *buf, size_t cap);

/* One GEMM call as a model makes it (row-major C (m, n) = op(A) op(B)). */
typedef struct {
    const char *what; /* "top.0 forward" */
    int m, n, k;
    bool ta, tb; /* A, B transposed */
    bool dbl;    /* dgemm (the float64 weight gradients) */
} model_gemm_shape_t;
/* Runs each GEMM once on fixed inputs and compares it with a float64
 * reference. Returns 0, KILN_ENOMEM, or KILN_ECORRUPT naming the first
 * product that disagrees (kiln_errmsg). */
int model_kernels_check(const model_gemm_shape_t *shapes, int nshapes);
/* model_kernels_check over every GEMM shape m's forward and backward make. */
int model_selfcheck(const model_t *m);

/* ---- bf16 dense layers (model_bf16.c) ------------------------------------------------ */

/* Whether cpu multiplies bf16 in hardware (AVX512_BF16 or AMX-BF16), which
 * model.dense_precision: bf16 needs. Returns 0, or KILN_EINVAL with a
 * message naming what the CPU lacks and what to do (use fp32). */
int model_bf16_check(const model_cpu_t *cpu);
/* model_bf16_check of this CPU, and that oneDNN may use its bf16
 * instructions: ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) set below
 * AVX512_CORE_BF16 is refused the same way, naming the variable. */
int model_bf16_check_here(void);
/* The oneDNN version and the implementation its first bf16 matmul of m
 * chose ("oneDNN 2.6 brg:avx512_core_bf16"), for the log; "" when m runs
 * fp32. */
void model_bf16_describe(const model_t *m, char *buf, size_t cap);

/* ---- implementation (only model/model*.c use what follows) --------------------- */
#ifdef MODEL_IMPL

#include <omp.h>

#define MODEL_MAX_GROUPS (4 * MODEL_MAX_LAYERS)

typedef struct model_bf16 model_bf16_t; /* model_bf16.c's per-model state */

typedef struct {
    int in, out;
    size_t w_off, b_off; /* W (out, in), b (out) in params / grads */
    int relu;            /* ReLU after the layer */
    /* bf16 only: the layer's input rounded to bf16 by the forward, (rows,
     * in) dense with rows = max_batch rounded up to row_block and the rows
     * past n zero; the backward's weight gradient reads it again. */
    uint16_t *bf_in;
    /* bf16 only: the layer's matmuls in model_bf16.c's table (-1: none):
     * forward, input gradient (each into a dense row_block block), the
     * 256-row weight-gradient block. */
    int mm_fwd, mm_bwd, mm_wg;
} model_layer_t;

struct model {
    model_type_t type;
    int S, F, d, k; /* k: fm factors (d - 1) */
    int fm_dense;   /* fm: X projected to k factors */
    int max_batch;
    uint64_t seed;
    model_dense_opt_t opt;

    size_t nparams;
    float *params;
    double *grads, *grads_lo; /* double-double sums over rows (kern_ops.h) */
    float *opt_a, *opt_b; /* adagrad acc | adam m; adam v */
    int64_t opt_t;
    model_group_t groups[MODEL_MAX_GROUPS];
    int ngroups;
    size_t w_off, b_off, vx_off; /* lr, fm: w (F), b (1), vx (k, F) */

    /* dlrm: bottom layers [0, nbottom), top layers [nbottom, nbottom + ntop). */
    model_layer_t layers[2 * MODEL_MAX_LAYERS];
    int nbottom, ntop;
    int P;    /* dlrm: S (S + 1) / 2 pairwise dot products */
    int ldr;  /* dlrm: d + P, the top MLP's input width */
    int maxw; /* dlrm: widest activation */

    /* The last forward: borrowed inputs and whether backward may use them. */
    int n;
    const float *E, *X, *y;
    int saved;

    /* Workspaces, each for max_batch rows. */
    float *logits; /* (max_batch) */
    float *probs;  /* (max_batch) */
    float *gz;     /* (max_batch) d loss / d logit, scaled */
    double *loss;  /* (max_batch) each row's logloss, summed in row order */
    float *fm_sum; /* fm: (max_batch, k) sum over slots (and u) of the factors */
    float *fm_u;   /* fm: (max_batch, k) u = X Vx^T; backward reuses it for du */
    float *act[2 * MODEL_MAX_LAYERS]; /* dlrm: layer outputs; the last bottom
                                            one is R's first d columns, the last
                                            top one is logits */
    float *R;       /* dlrm: (max_batch, d + P) top input [bottom out | dots] */
    float *gbuf[2]; /* dlrm: (max_batch, maxw) ping-pong activation gradients */
    /* model_grad_gemm: float64 copies of its two operands, (max_batch, maxc)
     * each; model_gemm_rows: the padded last block, (row_block, maxc) each. */
    double *wgA, *wgB;
    float *tailA, *tailC;
    /* One float32 buffer per OpenMP thread: model_grad_gemm's 256-row path
     * keeps a product of up to wgT_cap floats there (the largest rows x cols
     * of any weight gradient), dlrm's interaction its tiles
     * (model_dlrm_scratch floats); each buffer holds the larger. */
    float **wgT;
    int wgT_n;
    size_t wgT_cap;
    /* model_grad_gemm's 256-row path (row_block 256, more than one thread):
     * per thread, a (2, wgT_cap) double-double sum (hi then lo) of the
     * thread's blocks (the first thread's unused: it adds into the
     * gradient), zero between calls; then (2, maxc), model_dense_bwd_blocks's
     * column sums. */
    double **wgP;
    /* rows per BLAS call of model_gemm_rows: MODEL_GRAD_BLOCK when max_batch is a
     * multiple of it (then model_grad_gemm takes its 256-row path too), else
     * MODEL_ROW_BLOCK */
    int row_block;
    int maxc; /* the widest operand of any product */

    /* model.dense_precision (model_bf16.c): bf16 keeps a bf16 copy of the
     * parameters, remade by the first forward after they change (a step, a
     * load, a write through model_params). */
    model_dense_precision_t precision;
    model_bf16_t *bf;
    int bf_stale;
};

/* model_lr.c, model_fm.c, model_dlrm.c: the per-type halves. forward fills
 * m->logits for n rows; backward reads m->gz and writes dE and grads. */
void model_lr_forward(model_t *m, int n, const float *E, const float *X);
void model_lr_backward(model_t *m, int n, const float *E, const float *X, float *dE);
void model_fm_forward(model_t *m, int n, const float *E, const float *X);
void model_fm_backward(model_t *m, int n, const float *E, const float *X, float *dE);
void model_dlrm_forward(model_t *m, int n, const float *E, const float *X);
/* The floats of a thread's interaction tiles for S slots of width d. */
size_t model_dlrm_scratch(int S, int d);
void model_dlrm_backward(model_t *m, int n, const float *E, const float *X, float *dE);

/* model_dlrm.c: the dense layer on BLAS, shared by the models.
 * Y (n, out; leading dim ldy) = A (n, in; lda) W^T + b, then ReLU if relu. */
void model_dense_linear_fwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         float *Y, int ldy);
/* dW += dY^T A, db += dY^T 1 (both in float64), dA = dY W (skipped when dA
 * is NULL). */
void model_dense_linear_bwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         const float *dY, int ldy, float *dA, int ldda);

/* model_bf16.c: the bf16 matmuls, used by model_dense_linear_fwd/bwd when
 * m->precision is MODEL_DENSE_BF16. create sets every dlrm layer's mm_* and
 * bf_in and returns 0, KILN_ENOMEM or KILN_EINVAL (oneDNN refused a shape);
 * destroy frees what create made (accepts a model without it). */
int model_bf16_create(model_t *m);
void model_bf16_destroy(model_t *m);
/* The bf16 copy of the parameters, made again when m->bf_stale. */
void model_bf16_sync_weights(model_t *m);
/* dst (rows, cols) bf16 = src (n, cols; ld) rounded to nearest even, rows
 * n..round_up(n, m->row_block) zero. */
void model_bf16_round_rows(const model_t *m, int n, int cols, const float *src, int ld,
                        uint16_t *dst);
/* Y (n, out; ldy) = bf_in (n, in) W^T for layer L in row_block blocks. */
void model_bf16_fwd(model_t *m, int n, const model_layer_t *L, float *Y, int ldy);
/* dA (n, in; ldda) = dYb (n, out dense bf16) W, in row_block blocks. */
void model_bf16_bwd_input(model_t *m, int n, const model_layer_t *L, const uint16_t *dYb,
                       float *dA, int ldda);
/* The bf16 buffer for a layer's output gradient, (rows, maxw). */
uint16_t *model_bf16_dy(model_t *m);
/* t (out, in) = dYb[r0 .. r0 + 256)^T bf_in[r0 .. r0 + 256) of layer L, one
 * thread's matmul (model_grad_gemm's 256-row block in bf16). */
void model_bf16_grad_block(model_t *m, const model_layer_t *L, const uint16_t *dYb, size_t r0,
                        float *t);

/* model_blas.c: the BLAS calls, arranged so that no result depends on how a
 * batch is split over ranks or threads (see model_blas.c).
 *
 * C (n, nn; ldc) = A (n, k; lda) op(B), op(B) = B^T (B (nn, k)) when transb,
 * else B (B (k, nn)); computed in calls of exactly m->row_block rows
 * (MODEL_ROW_BLOCK, or MODEL_GRAD_BLOCK when max_batch is a multiple of it). */
#define MODEL_ROW_BLOCK 16
#define MODEL_GRAD_BLOCK 256
void model_gemm_rows(model_t *m, int n, int nn, int k, const float *A, int lda, int transb,
                  const float *B, int ldb, float *C, int ldc);
/* What model_gemm_rows_epi does to each row i of C after its block's GEMM,
 * element by element (the same operations as a separate pass, so the same
 * bits): with mask, C[i][j] = mask[i][j] > 0 ? C[i][j] : 0 (a ReLU's
 * gradient; bias and relu unused); else C[i][j] += bias[j], then
 * max(., 0) when relu. */
typedef struct {
    const float *bias; /* (nn) */
    int relu;
    const float *mask; /* (n, nn; ldm) or NULL */
    int ldm;
} model_epi_t;
/* Block blk of model_gemm_rows_epi for n rows: its rows [blk * row_block,
 * min(n, (blk + 1) * row_block)) of C, on the calling thread; the short
 * last block goes through m->tailA/tailC (one caller at a time). */
void model_gemm_rows_block(model_t *m, int n, int blk, int nn, int k, const float *A, int lda,
                           int transb, const float *B, int ldb, float *C, int ldc,
                           const model_epi_t *ep);
/* model_gemm_rows, then ep (NULL: none) on each block while it is in cache. */
void model_gemm_rows_epi(model_t *m, int n, int nn, int k, const float *A, int lda, int transb,
                         const float *B, int ldb, float *C, int ldc, const model_epi_t *ep);
/* The float64 sums over rows every weight gradient is made of.
 * G (rows, cols) += A^T B for A (n, rows; lda) and B (n, cols; ldb), float32
 * inputs, float64 products and sums; rows, cols <= m->maxc. */
void model_grad_gemm(model_t *m, int n, int rows, int cols, const float *A, int lda,
                  const float *B, int ldb, double *G);
/* Whether model_grad_gemm computes a (rows, cols) gradient's whole 256-row
 * blocks as float32 (or bf16) products, else all of it in float64; never
 * depends on n. Here, not in model_blas.c, because model_bf16.c asks it
 * too, and model_blas.c calls model_bf16.c. The floor of 512 takes dlrm's
 * first bottom layer (13 x 64 = 832) the blocked way: in float64 it cost
 * two float64 copies and a DGEMM a step, 2.4% of the bench dlrm's profile
 * for 0.1% of its flops. lr's and fm's dense products (F x 1, k x F) and
 * dlrm's last top layer stay exact. */
static inline bool model_grad_blocked(const model_t *m, int rows, int cols)
{
    const size_t cnt = (size_t)rows * (size_t)cols;
    return m->row_block == MODEL_GRAD_BLOCK && cnt >= 512 && cnt <= m->wgT_cap;
}
/* The threads of a parallel region in which each thread uses its own
 * m->wgT buffer: no more than there are buffers. */
static inline int model_buf_threads(const model_t *m)
{
    return omp_get_max_threads() < m->wgT_n ? omp_get_max_threads() : m->wgT_n;
}
/* model_grad_gemm for layer L's dW (out, in) += dY^T A, its whole 256-row
 * blocks in bf16 (model_bf16_grad_block; dYb is dY rounded) where model_grad_gemm
 * takes its block path, the other rows in float64 from dY and A. */
void model_grad_gemm_bf16(model_t *m, int n, const model_layer_t *L, const uint16_t *dYb,
                       const float *dY, int ldy, const float *A, int lda);
/* A dense layer's backward over the whole 256-row blocks of n rows, one
 * OpenMP region, each block's three parts while its dY rows are in cache:
 * gb (out) += the column sums of dY, G (out, in) += dY^T A (as
 * model_grad_gemm's blocks), dA = dY W with ep (as model_gemm_rows_epi's
 * blocks; skipped when dA is NULL); G and gb point into m's gradient.
 * Returns the rows done (a multiple of 256), or 0 (nothing done) where
 * model_grad_gemm does not take its 256-row path for (out, in), the model
 * is bf16, or there are fewer than two blocks: the caller does the rows
 * after those, and all of them on 0. The same bits as colsum, grad_gemm
 * and gemm_rows_epi over the same rows. */
int model_dense_bwd_blocks(model_t *m, int n, int out, int in, const float *dY, int ldy,
                           const float *A, int lda, const float *W, double *G, double *gb,
                           float *dA, int ldda, const model_epi_t *ep);
/* g (cols) += sum over the n rows of A (n, cols; lda), as double-double;
 * g points into m's gradient. */
void model_grad_colsum(model_t *m, int n, int cols, const float *A, int lda, double *g);

#endif /* MODEL_IMPL */

#ifdef __cplusplus
}
#endif

#endif /* KILN_MODEL_MODEL_H */
