/*
 * model/model_shape.c - what a model looks like from its spec, without
 * building it: the width of its tables' rows and the names of the model
 * types. Its own library (kiln_model_shape, no BLAS, no OpenMP), so that
 * programs that only describe models (kilnd and ops/, building a push's
 * description) do not load OpenBLAS, whose thread pool starts at load time
 * with every signal unblocked and would take kilnd's SIGTERM.
 */
#include "kiln.h"
#include "model.h"

int model_table_dim(model_type_t type, int spec_dim)
{
    switch (type) {
    case MODEL_LR:
        return 1;
    case MODEL_FM:
        if (spec_dim < 1)
            return kiln_errf(KILN_EINVAL, "fm: model.embedding.dim must be >= 1, got %d", spec_dim);
        return spec_dim + 1;
    case MODEL_DLRM:
        if (spec_dim < 1)
            return kiln_errf(KILN_EINVAL, "dlrm: model.embedding.dim must be >= 1, got %d",
                             spec_dim);
        return spec_dim;
    }
    return kiln_errf(KILN_EINVAL, "unknown model type %d", (int)type);
}

const char *model_type_name(model_type_t type)
{
    static const char *const names[] = {"lr", "fm", "dlrm"};
    return (unsigned)type < 3 ? names[type] : "?";
}

const char *model_precision_name(model_dense_precision_t p)
{
    static const char *const names[] = {"fp32", "bf16"};
    return (unsigned)p < 2 ? names[p] : "?";
}
